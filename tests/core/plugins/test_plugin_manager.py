"""The plugin system: entry-point discovery, enabling by config, requires/excludes."""
import pytest

from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError, DeepSpeedConfigModel
from deepspeed.plugin_manager import (DeepSpeedPlugin, PluginCatalog, PluginError, PluginSpec,
                                      check_compatibility, installed_plugins)

BASE = {"train_micro_batch_size_per_gpu": 2}


@pytest.fixture
def example_plugin(install_fixture_package):
    install_fixture_package("ds_example_plugin")


def catalog_config(catalog, **sections):
    return DeepSpeedConfig({**BASE, **sections}, sections=catalog.sections, world_size=1)


def test_fixture_plugins_are_discovered_through_entry_points(example_plugin):
    specs = installed_plugins()
    for name in ("call_recorder", "exclusive_example", "needy_example"):
        assert name in specs, f"{name} not discovered; found {sorted(specs)}"
        assert specs[name].distribution == "ds-example-plugin"
        assert specs[name].value.startswith("ds_example_plugin:")


def test_catalog_maps_each_section_to_its_plugin(example_plugin):
    catalog = PluginCatalog()
    assert catalog.owners["call_recorder"] == "call_recorder"
    assert catalog.sections_of("needy_example") == ["needy_example"]


def test_plugin_enabled_only_by_its_config_section(example_plugin):
    catalog = PluginCatalog()
    assert "call_recorder" not in catalog.enabled_names(catalog_config(catalog))
    on = catalog_config(catalog, call_recorder={})
    assert catalog.enabled_names(on) == ["call_recorder"]
    off = catalog_config(catalog, call_recorder={"enabled": False})
    assert catalog.enabled_names(off) == []
    pm = PluginCatalog().enabled_manager(on)
    assert [name for name, _ in pm.list_name_plugin()] == ["call_recorder"]


def test_each_catalog_has_fresh_plugin_instances(example_plugin):
    a, b = PluginCatalog(), PluginCatalog()
    assert a.plugins["call_recorder"] is not b.plugins["call_recorder"]


def test_excluded_plugins_error_names_both(example_plugin):
    catalog = PluginCatalog()
    config = catalog_config(catalog, call_recorder={}, exclusive_example={})
    with pytest.raises(PluginError, match="'exclusive_example'.*'call_recorder'"):
        catalog.enabled_manager(config)


def test_missing_requirement_error_names_both(example_plugin):
    catalog = PluginCatalog()
    config = catalog_config(catalog, needy_example={})
    with pytest.raises(PluginError, match="'needy_example' requires plugin 'call_recorder'"):
        catalog.enabled_manager(config)
    catalog.enabled_manager(catalog_config(catalog, needy_example={}, call_recorder={}))


def test_typo_in_plugin_section_is_a_config_error(example_plugin):
    catalog = PluginCatalog()
    with pytest.raises(DeepSpeedConfigError, match="call_recorder.record_fil"):
        catalog_config(catalog, call_recorder={"record_fil": "x"})


class _Section(DeepSpeedConfigModel):
    enabled: bool = True


class _ClaimsA(DeepSpeedPlugin):
    config_sections = {"shared_key": _Section}


def test_two_plugins_claiming_one_section_is_an_error(monkeypatch):
    import deepspeed.plugin_manager as pm_mod

    specs = {"first": PluginSpec("first", "x:A", "dist-a", "1"),
             "second": PluginSpec("second", "x:B", "dist-b", "1")}
    monkeypatch.setattr(pm_mod, "_load_entry_point", lambda name, value: _ClaimsA)
    with pytest.raises(PluginError, match="'first' and 'second' both claim"):
        PluginCatalog(specs)


def test_broken_plugin_names_itself_and_its_distribution():
    spec = PluginSpec("broken", "no_such_module_here:Plugin", "dist-broken", "0.1")
    with pytest.raises(PluginError, match="plugin 'broken'.*'dist-broken' failed to load"):
        spec.load()


def test_check_compatibility_accepts_plain_objects():
    class A:
        requires = ("b",)

    class B:
        excludes = ()

    check_compatibility({"a": A(), "b": B()})
    with pytest.raises(PluginError, match="'a' requires plugin 'b'"):
        check_compatibility({"a": A()})


def test_installed_plugins_are_read_once_until_an_install_changes_a_path_folder(tmp_path,
                                                                                monkeypatch):
    """Every ``deepspeed.initialize`` asks for the installed plugins; their distribution
    metadata is parsed again only when a ``sys.path`` folder changed (an install or removal
    adds or removes a folder there), not on every engine."""
    from deepspeed import plugin_manager

    read = []
    real = plugin_manager.distribution_of
    monkeypatch.setattr(plugin_manager, "distribution_of", lambda ep: read.append(ep) or real(ep))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    first = installed_plugins()
    assert read, "the first call after a sys.path change reads the metadata"
    read.clear()
    assert installed_plugins() == first and not read
    (site / "new_package-1.0.dist-info").mkdir()  # what an install leaves behind
    assert installed_plugins() == first and read


def test_a_hook_set_on_one_instance_is_not_taken_for_its_class():
    """Hook markers are read once per plugin class; an implementation added to one instance
    still counts for that instance only."""
    from deepspeed import hookimpl
    from deepspeed.plugin_manager import new_hook_manager

    class Plain:
        pass

    def deepspeed_config_sections():
        return {"only_this_one": DeepSpeedConfigModel}

    marked = Plain()
    marked.deepspeed_config_sections = hookimpl(deepspeed_config_sections)
    pm = new_hook_manager()
    pm.register(marked, name="marked")
    pm.register(Plain(), name="plain")
    assert [impl.plugin_name for impl in pm.hook.deepspeed_config_sections.get_hookimpls()] == ["marked"]
