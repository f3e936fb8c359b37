"""`python -m torchtpu [--json]`: the environment report to paste into a bug report."""
import sys

from torchtpu.tools.collect_env import main

sys.exit(main())
