"""``python -m orthros.train CONFIG.yaml [--key value ...]`` (also under torchrun): ``orthros train``,
with its exit codes and one-line errors."""

import sys

from orthros.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
