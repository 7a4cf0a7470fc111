"""Worker script: ``probe_world.py`` then ``train_with_recorder.py`` in the same ranks, so one
launch checks both a third-party accelerator's world and a third-party plugin's hooks (a launch
is seconds of start-up; each script alone is a fraction of one). Both write into sys.argv[-1]:
``rank<r>.json`` and ``rank<r>.jsonl``."""
import runpy
from pathlib import Path

HERE = Path(__file__).parent
runpy.run_path(str(HERE / "probe_world.py"), run_name="__main__")
runpy.run_path(str(HERE / "train_with_recorder.py"), run_name="__main__")
