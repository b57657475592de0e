"""A seeded sample workload on a realistic orders collection, for the demo and the UI.

Documents have nested sub-documents, arrays, dates, Decimal128 prices and ObjectIds; the
workload inserts, updates, replaces and deletes, and runs one multi-document transaction.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from bson import Decimal128, ObjectId
from pymongo import MongoClient, UpdateOne

CITIES = ["Lisbon", "Kraków", "Nairobi", "Osaka", "Valparaíso", "Tromsø", "Montréal", "Pune"]
SKUS = [f"SKU-{n:04d}" for n in range(1, 60)]
STATUSES = ["new", "paid", "packed", "shipped", "delivered"]


def make_order(rng: random.Random, now: datetime) -> dict[str, Any]:
    items = [
        {
            "sku": rng.choice(SKUS),
            "qty": rng.randint(1, 5),
            "price": Decimal128(Decimal(rng.randint(199, 99_999)) / 100),
        }
        for _ in range(rng.randint(1, 4))
    ]
    return {
        "_id": ObjectId(),
        "customer": {
            "name": f"Customer {rng.randint(1, 5000)}",
            "address": {"city": rng.choice(CITIES), "zip": f"{rng.randint(10000, 99999)}"},
            "vip": rng.random() < 0.1,
        },
        "items": items,
        "status": "new",
        "tags": rng.sample(["gift", "express", "fragile", "bulk", "promo"], k=rng.randint(0, 2)),
        "created_at": now - timedelta(seconds=rng.randint(0, 86_400)),
        "total": Decimal128(sum(Decimal(str(i["price"])) * i["qty"] for i in items)),
    }


def run_workload(
    client: MongoClient, database: str, collection: str, *, orders: int = 500, seed: int = 7
) -> Counter[str]:
    """Write one round of the workload; returns the operations done, by kind."""
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    coll = client[database][collection]
    done: Counter[str] = Counter()
    docs = [make_order(rng, now) for _ in range(orders)]
    coll.insert_many(docs, ordered=False)
    done["insert"] += len(docs)
    ids = [d["_id"] for d in docs]

    updates = [
        UpdateOne(
            {"_id": _id},
            {
                "$set": {"status": rng.choice(STATUSES[1:]), "updated_at": now},
                "$inc": {"revision": 1},
            },
        )
        for _id in rng.sample(ids, k=orders // 2)
    ]
    done["update"] += coll.bulk_write(updates, ordered=False).modified_count
    for _id in rng.sample(ids, k=max(1, orders // 20)):
        coll.update_one(
            {"_id": _id},
            {"$push": {"items": {"sku": rng.choice(SKUS), "qty": 1, "price": Decimal128("9.99")}}},
        )
        done["update"] += 1
    for _id in rng.sample(ids, k=max(1, orders // 25)):
        replacement = make_order(rng, now)
        replacement.pop("_id")
        coll.replace_one({"_id": _id}, replacement)
        done["replace"] += 1
    doomed = rng.sample(ids, k=max(1, orders // 10))
    done["delete"] += coll.delete_many({"_id": {"$in": doomed}}).deleted_count

    survivors = [i for i in ids if i not in set(doomed)]
    with client.start_session() as session, session.start_transaction():
        first, second = survivors[0], survivors[1]
        coll.update_one({"_id": first}, {"$set": {"status": "refunded"}}, session=session)
        coll.update_one({"_id": first}, {"$inc": {"revision": 1}}, session=session)
        coll.update_one({"_id": second}, {"$set": {"status": "refunded"}}, session=session)
        coll.insert_one(make_order(rng, now), session=session)
    done["transaction (4 writes)"] += 1
    return done
