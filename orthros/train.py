"""``python -m orthros.train CONFIG.yaml [--key value ...]`` (also under torchrun)."""

import sys

from orthros.training.cli import main

if __name__ == "__main__":
    sys.exit(main())
