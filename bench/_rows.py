"""A benchmark run's rows: kept in one JSON document, rewritten (atomically) after every row, so a run cut short
keeps what it measured; and the clock of ``--budget-s``."""

import json
import os
import time


class Run:
    """Rows, written to ``path`` after each one; a clock for ``--budget-s``."""

    def __init__(self, path, budget_s, meta):
        self.path, self.budget_s, self.t0 = path, budget_s, time.perf_counter()
        self.doc = dict(meta, rows=[])

    def add(self, row=None, /, **fields):
        """Append ``row`` (a dict) updated with ``fields``, write the document, return the row."""
        row = dict(row or {}, **fields)
        self.doc["rows"].append(row)
        if self.path:
            with open(self.path + ".part", "w") as f:
                json.dump(self.doc, f, indent=1)
            os.replace(self.path + ".part", self.path)
        return row

    def time_left(self) -> bool:
        """Whether ``--budget-s`` still allows a new row (says so once it does not)."""
        ok = self.budget_s is None or time.perf_counter() - self.t0 < self.budget_s
        if not ok:
            print(f"--budget-s {self.budget_s} reached: no new rows", flush=True)
        return ok
