"""``DeepSpeedEngine`` and the ``PipelineEngine`` implement ``deepspeed.hooks.Engine``: every
member a plugin may use exists on a real engine from ``deepspeed_engine_init`` on; the members
plugins add for their users (``deepspeed_engine_attributes``) never replace one the engine
has."""
import pytest

from deepspeed.hooks import Engine, protocol_members

def _members_seen_by_hooks(pipeline):
    """The Engine members missing on the engine, asked in deepspeed_engine_init and once built."""
    import torch

    import deepspeed
    from deepspeed.hooks import hookimpl as impl
    from deepspeed.plugin_manager import PluginCatalog

    missing_at_init = []

    class Watcher:
        @impl
        def deepspeed_engine_init(self, engine):
            missing_at_init.extend(m for m in protocol_members(Engine) if not hasattr(engine, m))

    original = PluginCatalog.enabled_manager

    def with_watcher(self, config, also=()):
        manager = original(self, config, also)
        manager.register(Watcher(), name="watcher")
        return manager

    PluginCatalog.enabled_manager = with_watcher
    try:
        config = {"train_micro_batch_size_per_gpu": 1,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
        if pipeline:
            from deepspeed.pipe import PipelineModule

            model = PipelineModule([torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)], num_stages=2,
                                   loss_fn=torch.nn.MSELoss())
        else:
            model = torch.nn.Linear(2, 1)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
    finally:
        PluginCatalog.enabled_manager = original
    missing = [m for m in protocol_members(Engine) if not hasattr(engine, m)]
    kind = type(engine).__name__
    engine.destroy()
    return kind, missing_at_init, missing


@pytest.mark.parametrize("pipeline", [False, True])
def test_the_engine_has_every_declared_member_from_engine_init_on(dist_pool, pipeline):
    for kind, at_init, built in dist_pool.run(_members_seen_by_hooks, args=(pipeline,)):
        assert kind == ("PipelineEngine" if pipeline else "DeepSpeedEngine")
        assert at_init == [] and built == [], (at_init, built)


def _adds(**attributes):
    from deepspeed.testing.hooks import plugin_answering

    return plugin_answering(engine_attributes=attributes)


def _engine_with(**plugins):
    """What ``_attach_plugin_attributes`` needs of an engine: hooks, and a member to clash with."""
    from deepspeed.testing.hooks import engine_stand_in

    engine = engine_stand_in(**plugins)
    engine.module = "the model"
    return engine


def _attach(engine):
    from deepspeed.engine import DeepSpeedEngine

    DeepSpeedEngine._attach_plugin_attributes(engine)


def test_plugins_add_members_for_users_through_the_hook():
    engine = _engine_with(alpha=_adds(get_theta=lambda: 0.5, scheduler=None))
    _attach(engine)
    assert engine.get_theta() == 0.5 and engine.scheduler is None


@pytest.mark.parametrize("plugins,message", [
    ({"alpha": _adds(module=1)}, "plugin 'alpha' adds engine attribute 'module', which the engine"
                                 " already has"),
    ({"alpha": _adds(theta=1), "beta": _adds(theta=2)},
     "adds engine attribute 'theta', which plugin '(alpha|beta)' already has"),
])
def test_an_added_member_never_replaces_another(plugins, message):
    with pytest.raises(AttributeError, match=message):
        _attach(_engine_with(**plugins))


def test_every_hookspec_and_engine_member_is_typed():
    """A plugin author learns argument and answer types from ``core/hooks.py`` alone: every
    hookspec annotates each argument and its return, and every ``Engine`` member has a type."""
    import inspect

    import deepspeed.hooks as hooks

    untyped = []
    for name in dir(hooks):
        spec = getattr(hooks, name)
        if not (name.startswith("deepspeed_") and callable(spec)
                and hasattr(spec, hooks.PROJECT_NAME + "_spec")):
            continue
        signature = inspect.signature(spec)
        untyped += [f"{name}({p.name})" for p in signature.parameters.values()
                    if p.annotation is inspect.Parameter.empty]
        if signature.return_annotation is inspect.Signature.empty:
            untyped.append(f"{name} -> ?")
    annotations = {}
    for klass in reversed(Engine.__mro__):
        annotations.update(getattr(klass, "__annotations__", {}))
    untyped += [f"Engine.{m}" for m in protocol_members(Engine)
                if m not in annotations and not callable(getattr(Engine, m, None))]
    assert untyped == []
