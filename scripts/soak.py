"""The long soak of the torture harness (tests/helpers/torture/) on its own mongod.

    PYTHONPATH=. python scripts/soak.py [--seed N] [--minutes M] [--streams a,b,...]
                                        [--history-lost] [--keep]

Prints its seed first (a random one unless given), then the table: duration, runs and kills
by kind, events written and captured, and the oracle's verdict per stream and check. Transforms
run in child JVMs here, and are SIGKILLed too. The exit code is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resources.embedded_mongo import start_mongod, stop_mongod  # noqa: E402
from tests.helpers.torture import TortureConfig, run_torture  # noqa: E402


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the writers write")
    parser.add_argument("--streams", default="", help="a subset of the variants, comma-separated")
    parser.add_argument(
        "--history-lost",
        action="store_true",
        help="the tiny-oplog variant: on_history_lost: resnapshot streams, oplog rolled past",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args()


def main() -> int:
    args = _args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    print(f"soak seed {seed} ({args.minutes:g} minutes of writes)", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"tidemark-soak-{seed}-"))
    tiny = {"oplog_size_mb": 1, "extra_args": ("--syncdelay", "1")} if args.history_lost else {}
    mongod = start_mongod(work / "mongod", **tiny)
    ok = False
    try:
        cfg = TortureConfig(
            seed=seed,
            write_seconds=args.minutes * 60,
            transform_in_child=True,
            history_lost=args.history_lost,
            streams=tuple(s for s in args.streams.split(",") if s),
        )
        ok, text, _ = run_torture(mongod.uri, work / "lake", f"sqlite:///{work / 'state.db'}", cfg)
        print(text)
        print(f"\nsoak seed {seed}: {'PASS' if ok else 'FAIL'} (work directory {work})")
        return 0 if ok else 1
    finally:
        stop_mongod(mongod)
        if ok and not args.keep:  # a failed soak keeps its lake and state store to look at
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
