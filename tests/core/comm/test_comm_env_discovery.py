"""Launcher-variable discovery for each launcher family, as pure functions of an env mapping."""
import sys
import types

import pytest

from deepspeed.comm import env_discovery, initialization
from deepspeed.comm.env_discovery import DiscoveryError, discover, expand_nodelist

FULL = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}


def test_launcher_that_set_everything_is_left_alone():
    found = discover(dict(FULL))
    assert found.values == {}
    assert found.launcher == "deepspeed launcher or caller"
    assert discover({**FULL, "TORCHELASTIC_RUN_ID": "x"}).launcher == "torchrun"


def test_no_launcher_is_a_world_of_one_on_the_given_port():
    found = discover({}, distributed_port=4321)
    assert found.values == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4321"}


@pytest.mark.parametrize("family, env", [
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}),
    ("mpich/intel-mpi", {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                         "MPI_LOCALNRANKS": "4"}),
    ("mvapich", {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4",
                 "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "4"}),
])
def test_mpi_families_on_one_node(family, env):
    found = discover(env, distributed_port=29511)
    assert found.launcher == family
    assert found.values == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


MULTI_NODE_OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}


def test_multi_node_mpi_asks_the_resolver_for_the_master():
    found = discover(MULTI_NODE_OMPI, master_addr_resolver=lambda: "10.0.0.7")
    assert found.values["MASTER_ADDR"] == "10.0.0.7"
    assert found.values["RANK"] == "5" and found.values["LOCAL_RANK"] == "1"


def test_multi_node_mpi_without_resolver_says_what_to_do():
    with pytest.raises(DiscoveryError, match="MASTER_ADDR.*mpi4py"):
        discover(MULTI_NODE_OMPI)


def test_fake_mpi4py_fills_all_five_variables(monkeypatch):
    calls = []

    class World:
        def Get_rank(self):
            return 5

        def bcast(self, value, root):
            calls.append((value, root))
            return "10.1.1.1"

    mpi4py = types.ModuleType("mpi4py")
    mpi4py.MPI = types.SimpleNamespace(COMM_WORLD=World())
    monkeypatch.setitem(sys.modules, "mpi4py", mpi4py)
    environ = dict(MULTI_NODE_OMPI)
    initialization.discover_environment(distributed_port=29533, verbose=False, environ=environ)
    assert {k: environ[k] for k in env_discovery.REQUIRED_VARS} == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "29533"}
    assert calls == [(None, 0)]  # a non-root rank contributes nothing to the broadcast


def test_mpi4py_resolver_is_none_without_mpi4py(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` raise ImportError
    assert env_discovery.mpi4py_master_addr() is None


SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}


@pytest.mark.parametrize("extra, master", [
    ({"SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9"}, "gpu07"),
    ({"SLURM_JOB_NODELIST": "a[3,5]"}, "a3"),
    ({"SLURM_NODELIST": "n1,n2"}, "n1"),
    ({"SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9"}, "10.9.9.9"),
    ({"SLURM_NNODES": "1"}, "127.0.0.1"),
])
def test_slurm_master_address(extra, master):
    found = discover({**SLURM, **extra}, distributed_port=29522)
    assert found.launcher == "slurm"
    assert found.values == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                            "MASTER_ADDR": master, "MASTER_PORT": "29522"}


def test_mpirun_inside_slurm_uses_the_mpi_ranks():
    found = discover({**SLURM, "SLURM_PROCID": "0", **MULTI_NODE_OMPI, "SLURM_NODELIST": "n[1-2]"})
    assert found.launcher == "openmpi"
    assert found.values["RANK"] == "5"
    assert found.values["MASTER_ADDR"] == "n1"


def test_azureml_and_sagemaker_name_the_master():
    azure = discover({**MULTI_NODE_OMPI, "AZ_BATCH_MASTER_NODE": "10.2.3.4:6105"},
                     distributed_port=29544)
    assert azure.values["MASTER_ADDR"] == "10.2.3.4"
    assert azure.values["MASTER_PORT"] == "29544"
    sagemaker = discover({**MULTI_NODE_OMPI, "SM_HOSTS": '["algo-1", "algo-2"]'})
    assert sagemaker.values["MASTER_ADDR"] == "algo-1"
    with pytest.raises(DiscoveryError, match="SM_HOSTS"):
        discover({**MULTI_NODE_OMPI, "SM_HOSTS": "algo-1"})


def test_variables_already_set_win():
    found = discover({**MULTI_NODE_OMPI, "MASTER_ADDR": "me", "MASTER_PORT": "7"})
    assert found.values == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}


def test_missing_local_rank_is_a_warning_not_a_guess():
    found = discover({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert "LOCAL_RANK" not in found.values
    assert any("LOCAL_RANK" in warning for warning in found.warnings)


@pytest.mark.parametrize("env, message", [
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "rank 4 .* world of 4"),
    ({"WORLD_SIZE": "4"}, "WORLD_SIZE=4 is set but RANK is not"),
    ({"RANK": "2"}, "RANK=2 is set but WORLD_SIZE is not"),
])
def test_inconsistent_environments_are_errors(env, message):
    with pytest.raises(DiscoveryError, match=message):
        discover(env)


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("a[08-10]", ["a08", "a09", "a10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("single", ["single"]),
    ("x[9-11]y", ["x9y", "x10y", "x11y"]),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, message", [
    ("node[1-3", "unbalanced"), ("node1-3]", "unbalanced"), ("node[3-1]", "descending"),
    ("node[a-b]", "bad range"), ("", "empty"),
])
def test_expand_nodelist_rejects_malformed_lists(nodelist, message):
    with pytest.raises(ValueError, match=message):
        expand_nodelist(nodelist)
