# The bundle's entry point (PyInstaller needs a script; the package's own entry point is the
# console script `vocable = vocable.cli:main`, which a frozen app does not have).
import sys

from vocable.cli import main

if __name__ == "__main__":
    sys.exit(main())
