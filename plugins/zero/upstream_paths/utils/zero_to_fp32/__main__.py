"""``python -m deepspeed.utils.zero_to_fp32 <checkpoint_dir> <output>``: the offline script."""
import sys

from deepspeed.zero.zero_to_fp32 import main

if __name__ == "__main__":
    sys.exit(main())
