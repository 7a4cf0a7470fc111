"""``deepspeed --autotuning tune|run``: profile the model, run the experiments, pick the best.

1. Profiling run: the user's job at micro-batch 1 with ``autotuning.model_info.profile``; it
   records parameters, activation memory per sample, the memory each rank has and how long
   its profiled steps took (the plan's calibration).
2. Per ZeRO stage of the space: the micro-batch sizes memory allows (``num_tuning_micro_batch_
   sizes`` of them, log-spaced up to the largest whose ``deepspeed.plan`` peak fits; user lists
   and fixed values kept). With ``plan_pruning`` the plan's estimate of every experiment of
   every stage then skips those predicted not worth running (``planning.py``). Each stage's
   experiments are run by the chosen tuner; an out-of-memory failure prunes the larger sizes of
   that stage. With ``fast: false`` the stage's ZeRO knobs are then tuned at its best
   micro-batch size.
3. The summary table per stage, ``ds_config_optimal.json`` and ``cmd_optimal.txt`` in
   ``results_dir``; ``run`` then trains with the best config through the same launcher.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from typing import List, Optional

from pydantic import ValidationError

from deepspeed.autotuning import jobs, planning, space as sp
from deepspeed.autotuning.config import AutotuningConfig
from deepspeed.autotuning.report import score, write_summary
from deepspeed.autotuning.tuner import make_tuner
from deepspeed.config.loader import load_config_source
from deepspeed.utils.progress import progress, progress_write

EXPERIMENT_KEYS = ("wall_clock_breakdown", "steps_per_print")


class AutotuningError(RuntimeError):
    """The search could not produce a configuration (every experiment failed, ...)."""


def _clock(start):
    seconds = int(time.perf_counter() - start)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def timed(config: dict) -> dict:
    """An experiment's config: the engine's timers on (the probe reads them), its progress
    lines off (``EXPERIMENT_KEYS``, restored to the user's values in the best config)."""
    config["wall_clock_breakdown"] = True
    config["steps_per_print"] = 10 ** 9
    return config


def dotted_get(config: dict, key: str):
    value = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class Autotuner:
    def __init__(self, args, argv: List[str]):
        from deepspeed.launcher.runner import check_user_script

        check_user_script(args)  # every experiment would run it
        self.bar = None  # counts experiments while the search runs (drawn on a terminal only)
        self.mode = args.autotuning
        self.command = jobs.split_command(args, argv)
        self.user_config = load_config_source(self.command.config_path)
        raw_section = self.user_config.get("autotuning") or {}
        if not raw_section.get("enabled", False):
            self._say("note: the config has no \"autotuning\": {\"enabled\": true}; tuning with "
                      "the default autotuning settings")
        try:
            self.section = AutotuningConfig(**{**raw_section, "enabled": True})
        except ValidationError as exc:
            raise ValueError("; ".join(
                f"autotuning.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"]
                else f"autotuning: {e['msg']}" for e in exc.errors())) from None
        self.space = sp.build_space(self.user_config, self.section,
                                    source=self.command.config_path)
        self.world, self.ranks_per_node = self._world_size(args)
        if self.world % self.section.mp_size:
            raise ValueError(f"autotuning.mp_size ({self.section.mp_size}) does not divide the "
                             f"world size {self.world}")
        self.dp_world = self.world // self.section.mp_size
        self.results_dir = os.path.abspath(self.section.results_dir)
        self.exps_dir = os.path.abspath(self.section.exps_dir)
        self.experiments = []  # records of every experiment run (for the summary)
        self.pruned = []
        self.failures = []
        self.oom = set()  # (stage, micro-batch) that ran out of memory
        self.planner = None  # deepspeed.plan over the profiled model (after profile())
        self.start = time.perf_counter()
        self.count = 0

    def _say(self, text):
        """One progress line, printed above the bar so that the bar stays in one piece."""
        progress_write(f"[autotuning] {text}", self.bar)

    @staticmethod
    def _world_size(args):
        """(ranks in all, ranks on the fullest node)."""
        from deepspeed.launcher.runner import resolve_resources

        probe = copy.copy(args)
        _pool, active = resolve_resources(probe, dict(os.environ))
        per_node = [len(slots) for slots in active.values()]
        return sum(per_node), max(per_node, default=1)

    # -- one experiment -------------------------------------------------------------------------
    def _autotuning_section(self, **extra):
        section = self.section.model_dump(exclude_none=True, exclude={"model_info"})
        section.update(extra)
        return section

    def _arg_values(self, config):
        values = {}
        for key, flag in (self.section.arg_mappings or {}).items():
            value = dotted_get(config, key)
            if value is not None:
                values[flag] = value
        return values

    def _run(self, name, config, result_file):
        exp_dir = os.path.join(self.results_dir, name)
        os.makedirs(self.exps_dir, exist_ok=True)
        with open(os.path.join(self.exps_dir, f"{name}.json"), "w", encoding="utf-8") as handle:
            json.dump({"name": name, "num_gpus": self.world, "ds_config": config,
                       "result_dir": exp_dir}, handle, indent=2)
        return jobs.run_job(self.command, name, config, exp_dir, result_file,
                            self._arg_values(config), self.section.overwrite)

    def experiment_config(self, point):
        section = self._autotuning_section(
            metric_path=os.path.join(self.results_dir, point.name, "metrics.json"))
        config = sp.experiment_config(self.user_config, point, self.dp_world, self.space, section)
        return timed(config)

    def evaluate(self, point) -> Optional[float]:
        config = self.experiment_config(point)
        result = self._run(point.name, config, config["autotuning"]["metric_path"])
        self.count += 1
        record = {"name": point.name, "stage": point.stage, "micro_batch": point.micro_batch,
                  "gas": point.gas, "knobs": dict(point.knobs), "log": result.log_path,
                  "metric_value": None, "metrics": result.metrics}
        if result.ok:
            record["metric_value"] = result.metrics[self.section.metric]
            text = f"{self.section.metric} {record['metric_value']:.4g}" + \
                (" (reused)" if result.reused else "")
        else:
            record["error"] = result.error
            self.failures.append(record)
            if result.out_of_memory:
                self.oom.add((point.stage, point.micro_batch))
            text = f"FAILED ({result.error or f'exit code {result.returncode}'}); log: " \
                   f"{result.log_path}"
        self.experiments.append(record)
        if self.bar is not None:
            self.bar.update(1)
        self._say(f"[{_clock(self.start)}] experiment {self.count} {point.name}: {text}")
        return None if not result.ok else score(self.section.metric, result.metrics)

    # -- the search -----------------------------------------------------------------------------
    def profile(self) -> Optional[dict]:
        path = self.section.model_info_path
        if path and os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                return json.load(handle)
        known = self.section.model_info
        if known is not None and known.num_params:
            return {"num_params": known.num_params, "activation_mem_per_sample": 0}
        name = "profile_model_info"
        info_path = os.path.join(self.results_dir, name, "model_info.json")
        section = self._autotuning_section(model_info={"profile": True},
                                           model_info_path=info_path)
        section.pop("metric_path", None)
        self._say(f"profiling the model (parameters, activation memory) on {self.world} rank(s)")
        # stage 0 sees the parameters whole (exact activation bytes); stage 3 is the fallback
        # for a model whose states do not fit unpartitioned
        for stage in (0, 3):
            point = sp.Point(stage, self.section.min_train_micro_batch_size_per_gpu, 1)
            config = timed(sp.experiment_config(self.user_config, point, self.dp_world,
                                                self.space, section))
            result = self._run(name, config, info_path)
            if result.ok:
                break
            self._say(f"profiling run at ZeRO stage {stage} failed ({result.error}); log: "
                      f"{result.log_path}")
        else:
            self._say("tuning without memory pruning")
            return None
        info = result.metrics
        self._say(f"model info: {info['num_params']:,} parameters, "
                  f"{info['activation_mem_per_sample'] / 2**20:.2f} MiB activations per sample, "
                  f"{info['memory_per_rank'] / 2**30:.1f} GiB memory per rank")
        return info

    def calibrate(self, model_info):
        """The plan's fixed cost per micro-batch, from the profiling run's measured steps."""
        measured = (model_info or {}).get("profile_metrics")
        if self.planner is None or not measured:
            return
        point = sp.Point(measured["zero_stage"], measured["train_micro_batch_size_per_gpu"],
                         measured["gradient_accumulation_steps"])
        overhead = self.planner.calibrate(self.experiment_config(point), measured["latency"])
        self._say(f"plan: {overhead * 1000:.3g} ms per micro-batch beyond the roofline "
                  f"(measured {measured['latency']:.4g} ms per step in the profiling run)")

    def stage_points(self, stage):
        """The experiments of ``stage``'s micro-batch space (memory pruning applied)."""
        micro_batches, why = sp.micro_batches_for_stage(self.space, stage, self.section,
                                                        self.planner, self.dp_world,
                                                        self.user_config)
        if why:
            self.pruned.append({"stage": stage, "reason": why})
        if not micro_batches:
            self._say(f"stage {stage}: pruned ({why or 'no feasible micro-batch size'})")
            return []
        self._say(f"stage {stage}: micro-batch sizes {micro_batches}" + (f" ({why})" if why else ""))
        return sp.points_for_stage(self.space, stage, micro_batches, self.dp_world)

    def plan_prune(self, points):
        """``plan_pruning``: the points the plan predicts worth running, in their order."""
        if not self.section.plan_pruning or self.planner is None or not points:
            return points
        kept, skipped = planning.prune(
            points, lambda p: self.planner.score(self.experiment_config(p), self.section.metric),
            self.section.plan_keep_ratio)
        for point, why in skipped.items():
            self.pruned.append({"stage": point.stage, "reason": f"{point.name}: {why}"})
        if skipped:
            self._say(f"plan pruning skips {len(skipped)} of {len(points)} experiments: "
                      + ", ".join(f"{p.name} ({why})" for p, why in skipped.items()))
        return kept

    def tune_stage(self, stage, points):
        if not points:
            return None
        tuner = make_tuner(self.section.tuner_type, points, self.section.tuner_num_trials,
                           self.section.tuner_early_stopping)
        too_big = lambda p: any(s == p.stage and m <= p.micro_batch for s, m in self.oom)  # noqa
        results = tuner.tune(self.evaluate, skip=too_big)
        done = [(p, s) for p, s in results if s is not None]
        best = max(done, key=lambda item: item[1])[0] if done else None
        knob_points = self.plan_prune(sp.knob_points(self.space, best)) if best is not None else []
        if knob_points:
            self._say(f"stage {stage}: tuning ZeRO knobs at micro-batch {best.micro_batch}")
            tuner = make_tuner(self.section.tuner_type, knob_points,
                               self.section.tuner_num_trials, self.section.tuner_early_stopping)
            tuner.tune(self.evaluate)
        return best

    def run_search(self):
        for directory in (self.results_dir, self.exps_dir):
            os.makedirs(directory, exist_ok=True)
        self._say(f"mode {self.mode}: tuning ZeRO stages {self.space.stages} on {self.world} "
                  f"rank(s), metric {self.section.metric}, tuner {self.section.tuner_type}; "
                  f"results in {self.results_dir}")
        model_info = self.profile()
        self.planner = planning.planner_for(model_info, self.dp_world, self.ranks_per_node)
        self.calibrate(model_info)
        if self.section.plan_pruning and self.planner is None:
            self._say("plan_pruning needs the profiling run's figures (parameters, activations, "
                      "memory per rank); without them every experiment runs")
        # the whole space is planned at once: pruning compares stages with each other
        points = [p for stage in self.space.stages for p in self.stage_points(stage)]
        points = self.plan_prune(points)
        # the number of experiments is not known in advance (pruning, early stopping): the bar
        # counts them and shows the elapsed time
        self.bar = progress(desc="autotuning experiments", unit="exp")
        try:
            for stage in self.space.stages:
                self.tune_stage(stage, [p for p in points if p.stage == stage])
        finally:
            self.bar.close()
            self.bar = None
        measured = [r for r in self.experiments if r["metric_value"] is not None]
        if not measured:
            logs = "\n".join(f"  {r['name']}: {r.get('error') or 'failed'} (log: {r['log']})"
                             for r in self.failures) or "  (no experiment was feasible)"
            pruned = "; ".join(p["reason"] for p in self.pruned)
            raise AutotuningError(f"every autotuning experiment failed, no configuration to "
                                  f"choose:\n{logs}" + (f"\npruned: {pruned}" if pruned else ""))
        best = max(measured, key=lambda r: score(self.section.metric, r["metrics"]))
        return best

    def write_best(self, best):
        config = copy.deepcopy(self.experiment_config(
            sp.Point(best["stage"], best["micro_batch"], best["gas"],
                     tuple(sorted(best["knobs"].items())))))
        for key in EXPERIMENT_KEYS:  # back to what the user wrote
            if key in self.user_config:
                config[key] = self.user_config[key]
            else:
                config.pop(key, None)
        if "autotuning" in self.user_config:
            config["autotuning"] = self.user_config["autotuning"]
        else:
            config.pop("autotuning")
        path = os.path.join(self.results_dir, "ds_config_optimal.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
        script_args = self.command.with_config(path, self._arg_values(config))
        with open(os.path.join(self.results_dir, "cmd_optimal.txt"), "w", encoding="utf-8") as h:
            h.write(self.command.display(script_args) + "\n")
        return path, script_args

    def main(self):
        if self.section.overwrite and os.path.isdir(self.results_dir):
            shutil.rmtree(self.results_dir)
        best = self.run_search()
        elapsed = time.perf_counter() - self.start
        text = write_summary(self.results_dir, self.section.metric, self.experiments,
                             self.pruned, best, elapsed)
        path, script_args = self.write_best(best)
        print(text, flush=True)
        self._say(f"tuning took {_clock(self.start)} over {len(self.experiments)} experiments; "
                  f"best {best['name']} ({self.section.metric} {best['metric_value']:.4g}); "
                  f"config: {path}")
        if self.mode != "run":
            return 0
        self._say(f"run: training with {best['name']}: "
                  f"{self.command.display(script_args)}")
        return subprocess.run(self.command.runner_command(script_args), check=False).returncode


def run_autotuning(args, argv):
    """The launcher's entry for ``--autotuning``; returns the exit status."""
    try:
        return Autotuner(args, argv).main()
    except (AutotuningError, sp.NothingToTuneError) as err:
        print(f"deepspeed: autotuning error: {err}", file=sys.stderr, flush=True)
        return 1
