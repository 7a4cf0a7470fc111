"""The ``elasticity`` plugin: owns the ``elasticity`` section, decides the batch sizes of an
elastic job, and runs ``deepspeed --elastic_training`` under torch elastic.

Elasticity takes the batch keys out of the user's hands: ``deepspeed_batch_size`` answers with
the elastic plan for the current world (the same global batch at every valid world size, the
accumulation steps making up the difference), so a job restarted on fewer or more workers keeps
training the same optimisation problem from its checkpoint.
"""
import deepspeed
from deepspeed.elasticity.config import ElasticityConfig, ElasticityConfigError
from deepspeed.elasticity.elasticity import (ELASTICITY, compute_elastic_config,
                                             ensure_immutable_elastic_config, parse_elastic_config)
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.logging import logger

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def elastic_batch(raw_config, dp_world_size):
    """(train_batch_size, micro batch per GPU, accumulation steps) for this world, or None when
    elasticity is off."""
    section = raw_config.get(ELASTICITY)
    if not isinstance(section, dict) or not section.get("enabled", False):
        return None
    config = parse_elastic_config(section)
    given = [key for key in BATCH_KEYS if key in raw_config]
    if given and not config.ignore_non_elastic_batch_info:
        raise ElasticityConfigError(
            f"batch keys {', '.join(given)} are set next to an enabled 'elasticity' section, "
            f"which takes control of them and would ignore them; remove them or set "
            f"'elasticity.ignore_non_elastic_batch_info': true")
    ensure_immutable_elastic_config(section)
    world = dp_world_size * config.model_parallel_size
    final_batch, _valid, micro = compute_elastic_config(raw_config, deepspeed.__version__,
                                                        world_size=world)
    if micro is None:
        raise ElasticityConfigError(
            f"no micro batch size in {config.micro_batch_sizes} divides the per-rank share of "
            f"the elastic batch size {final_batch} at {dp_world_size} data-parallel ranks")
    gas = final_batch // (micro * dp_world_size)
    logger.info(f"elasticity: world size {world} -> train_batch_size {final_batch} = micro batch "
                f"{micro} x {gas} accumulation step(s) x {dp_world_size} rank(s)")
    return final_batch, micro, gas


class ElasticityPlugin(DeepSpeedPlugin):
    config_sections = {ELASTICITY: ElasticityConfig}
    excludes = ("pipe",)  # a pipeline fixes its micro-batch count per stage layout

    @hookimpl
    def deepspeed_batch_size(self, config, world_size):
        return elastic_batch(config, world_size)

    @hookimpl
    def deepspeed_launcher_arguments(self, parser):
        return [
            parser.add_argument("--elastic_training", action="store_true",
                                help="Run the workers under torch elastic rendezvous, so the job "
                                     "survives workers leaving and joining (elasticity plugin)."),
            parser.add_argument("--min_elastic_nodes", type=int, default=-1,
                                help="With --elastic_training: fewest nodes to train on "
                                     "(default 1)."),
            parser.add_argument("--max_elastic_nodes", type=int, default=-1,
                                help="With --elastic_training: most nodes to train on (default: "
                                     "the number of hosts)."),
        ]

    @hookimpl
    def deepspeed_launcher_command(self, args, argv):
        if not hasattr(args, "elastic_training"):
            return None
        check_elastic_flags(args)
        if not args.elastic_training:
            return None
        from deepspeed.elasticity.agent import run_elastic
        from deepspeed.launcher.runner import check_user_script

        check_user_script(args)  # before the agent starts any worker

        return run_elastic(args)


def check_elastic_flags(args):
    """Reject the elastic node bounds without ``--elastic_training`` or out of order."""
    if not args.elastic_training and (args.min_elastic_nodes != -1 or args.max_elastic_nodes != -1):
        raise ValueError("--min_elastic_nodes/--max_elastic_nodes need --elastic_training")
    for flag, value in (("--min_elastic_nodes", args.min_elastic_nodes),
                        ("--max_elastic_nodes", args.max_elastic_nodes)):
        if value == 0 or value < -1:
            raise ValueError(f"{flag} must be a positive integer (or -1 for the default), "
                             f"got {value}")
    if 0 < args.max_elastic_nodes < args.min_elastic_nodes:
        raise ValueError(f"--max_elastic_nodes ({args.max_elastic_nodes}) is smaller than "
                         f"--min_elastic_nodes ({args.min_elastic_nodes})")
