"""``python -m indexer_topk``: the ``indexer-topk`` command."""

import sys

from .cli import main

sys.exit(main())
