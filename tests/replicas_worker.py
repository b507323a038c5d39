"""One replica group of one process for tests/test_replicas.py: a small model trained with
`workers.replicas.Replicas`, a JSON line per step in OUT (committed or not, the quorum's size,
the loss, the steps it healed at), the final weights' checksum at the end.

    python tests/replicas_worker.py GROUP STEPS OUT      (TORCHFT_LIGHTHOUSE set)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed import TCPStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.replicas import Replicas, lighthouse_address  # noqa: E402

STEP_PAUSE_S = 0.05  # steps slow enough that a test can kill a group mid-run


def main(group: int, steps: int, out: Path) -> None:
    torch.manual_seed(0)  # the same initial weights in every group
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"step": 0}

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": state["step"]}

    def load_state_dict(peer: dict) -> None:
        model.load_state_dict(peer["model"])
        optimizer.load_state_dict(peer["optim"])
        state["step"] = peer["step"]

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the group's own
    here = ("127.0.0.1", store.port)
    replicas = Replicas(
        group, 2, 0, 1, lighthouse_address(), state_dict, load_state_dict, job="test", store=here
    )
    data = torch.Generator().manual_seed(100 + group)  # each group its own batches
    with out.open("a") as log:
        while state["step"] < steps:
            x = torch.randn(16, 8, generator=data)
            replicas.begin()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            replicas.average(model)
            committed = replicas.commit()
            if committed:
                optimizer.step()
                state["step"] += 1
            stop = replicas.stop_agreed(1 if state["step"] == steps else 0)
            line = {
                "group": group,
                "step": state["step"],
                "committed": committed,
                "participants": replicas.participants,
                "leads": replicas.leads,
                "healed_at": replicas.healed_at,
                "stop": stop,
                "time": time.time(),
            }
            log.write(json.dumps(line) + "\n")
            log.flush()
            time.sleep(STEP_PAUSE_S)
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        log.write(json.dumps({"group": group, "final": weights.tolist()}) + "\n")
    replicas.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    os._exit(0)  # torchft's threads would hold the process
