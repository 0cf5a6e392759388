import sys

from hispec.cli.main import main

sys.exit(main())
