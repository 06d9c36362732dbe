"""A module spawned children import: it records, at import time, what the environment held then."""

import json
import os

AT_IMPORT = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PADDLE_DISTRI_BACKEND", "TORCHELASTIC_RUN_ID",
                                            "TORCHELASTIC_USE_AGENT_STORE", "GROUP_RANK")}


def record(out_dir):
    rank = os.environ["RANK"]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"at_import": AT_IMPORT, "selected": os.environ.get("FLAGS_selected_gpus"),
                   "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}, f)
