"""`python -m trainroom.core.keeper RUN_DIR`: what `launch` starts, detached, for one run."""

import sys

from trainroom.core.keeper.loop import main

sys.exit(main())
