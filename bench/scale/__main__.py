"""`python -m bench.scale`: see bench/scale/__init__.py."""

import sys

from bench.scale.run import main

sys.exit(main())
