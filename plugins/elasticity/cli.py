"""``ds_elastic``: print the elastic batch plan of a DeepSpeed config, before any job starts.

    ds_elastic -c ds_config.json            # the batch size and every GPU count it trains on
    ds_elastic -c ds_config.json -w 4       # ... and the micro-batch per GPU at world size 4

A scheduler (or a person sizing a job) runs it to learn which GPU counts a config accepts; the
numbers are exactly what the engine computes at start-up (``compute_elastic_config``).
"""
import argparse
import json
import sys

import deepspeed
from deepspeed.elasticity.config import ElasticityError
from deepspeed.elasticity.elasticity import ELASTICITY, compute_elastic_config

RULE = "-" * 42


def _read_config(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as err:
        raise SystemExit(f"ds_elastic: cannot read the config '{path}': {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise SystemExit(f"ds_elastic: '{path}' is not JSON: {err}") from err


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="ds_elastic", description="Print the elastic training plan of a DeepSpeed config.")
    parser.add_argument("-c", "--config", required=True, help="DeepSpeed config JSON file")
    parser.add_argument("-w", "--world-size", type=int, default=0,
                        help="Intended/current world size (GPU count); 0 prints the plan only")
    args = parser.parse_args(argv)
    if args.world_size < 0:
        parser.error(f"--world-size must be >= 0, got {args.world_size}")
    return args


def main(argv=None):
    args = parse_args(argv)
    ds_config = _read_config(args.config)
    if not isinstance(ds_config, dict) or ELASTICITY not in ds_config:
        raise SystemExit(f"ds_elastic: '{args.config}' has no 'elasticity' section")
    print(RULE)
    print("Elasticity config:")
    print(RULE)
    print(json.dumps(ds_config[ELASTICITY], indent=4, sort_keys=True))
    try:
        plan = compute_elastic_config(ds_config, deepspeed.__version__, world_size=args.world_size,
                                      return_microbatch=args.world_size > 0)
    except ElasticityError as err:
        raise SystemExit(f"ds_elastic: {type(err).__name__}: {err}") from err
    print(RULE)
    print(f"Calculated results for world size {args.world_size}:" if args.world_size > 0
          else "Calculated results:")
    print(RULE)
    print(f"final_batch_size .... {plan[0]}")
    print(f"valid_gpus .......... {plan[1]}")
    if args.world_size > 0:
        print(f"micro_batch_size .... {plan[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
