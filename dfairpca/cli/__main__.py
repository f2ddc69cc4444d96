"""``python -m dfairpca.cli``: the same command line as ``dfairpca``."""

import sys

from . import main

sys.exit(main())
