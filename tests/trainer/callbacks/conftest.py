"""The callback tests share tests/trainer's helpers (``trainer_helpers``, ``test_model``'s Paddle model)."""

import os
import sys

_TRAINER_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TRAINER_TESTS not in sys.path:
    sys.path.insert(0, _TRAINER_TESTS)
