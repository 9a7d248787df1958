"""`python -m trainroom.core.ckpt`: the verifier child (`ckpt.verifier.main`), one-shot or `--serve`."""

import sys

from trainroom.core.ckpt.verifier import main

sys.exit(main())
