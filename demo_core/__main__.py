import sys

from commandline.main import main

sys.exit(main())
