"""`python -m speakermem`: the same command line as the `speakermem` script."""

import sys

from speakermem.integrations.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
