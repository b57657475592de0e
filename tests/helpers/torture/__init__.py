"""The torture harness: steady writers, a seeded scheduler of real pipeline runs, and an oracle.

Writers keep writing (a busy collection, a sparse one, a pre-image one, DDL on another, and a
second database that is dropped now and then) while a seeded scheduler starts drains,
replays, resnapshots, gc and transforms, several at a time, in this process or in child
processes that it SIGKILLs at random moments. A monitor thread samples every stream's stored
checkpoint. After the writers stop and one clean run of each step, the oracle checks:

1. every collection's `current` Delta table, read with `deltalake` (no JVM, no Tidemark code)
   from the tables the state store records, equals `find()` for every namespace in scope (or,
   for streams that stopped at an invalidate or hide DDL with `$match`, a pure-Python fold of
   the reference events);
2. the `changes` tables hold exactly the events a plain `watch()` returns over the covered
   ranges (incremental segments between explicit moves, plus replay windows): none missing,
   none twice;
3. every file a committed raw batch lists exists;
4. no stored token (sampled, or a batch's `token_after`) covered an event that was not in an
   incremental batch committed by then.

By role: `config` (settings and stream variants), `writers`, `children` (the killable child runs),
`scheduler` (the run), `reference` (plain `watch()`), `checks` (the oracle), `report`.
"""

from tests.helpers.torture.config import TortureConfig
from tests.helpers.torture.report import run_torture

__all__ = ["TortureConfig", "run_torture"]
