"""``python -m deepspeed.checkpoint.ds_to_universal --input_folder ... --output_folder ...``."""
import sys

from deepspeed.zero.ds_to_universal import main

if __name__ == "__main__":
    sys.exit(main())
