"""The history: every request and its answer, every event a stream
received, every fault, as JSON lines with the client's monotonic time `t`
(seconds since the campaign began) and wall time `w` (ms since the epoch).
The checker reads nothing else."""

import json
import threading
import time


class History:
    def __init__(self, path):
        self.path = path
        self._f = open(path, "w", buffering=1)
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self.count = 0

    def now(self):
        return time.monotonic() - self.t0, int(time.time() * 1000)

    def record(self, rec):
        t, w = self.now()
        rec.setdefault("t", round(t, 4))
        rec.setdefault("w", w)
        line = json.dumps(rec, separators=(",", ":"), sort_keys=True)
        with self._lock:
            self._f.write(line + "\n")
            self.count += 1

    def close(self):
        with self._lock:
            self._f.close()


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
