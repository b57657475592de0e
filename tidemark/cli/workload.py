"""Seeded sample workloads for the demo and the UI: an orders collection for a collection
stream, and a small shop (customers, products, orders) for a database stream.

Documents have nested sub-documents, arrays, dates, Decimal128 prices and ObjectIds; the
workloads insert, update, replace and delete, and run a multi-document transaction. The shop's
three collections have fields of their own (a customer's `email`, a product's `stock`, an
order's `lines`), so each collection table shows different columns in the Catalog.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from bson import Decimal128, ObjectId
from pymongo import MongoClient, UpdateOne

from tidemark.config import StreamConfig

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


COUNTRIES = ["PT", "PL", "KE", "JP", "CL", "NO", "CA", "IN"]
CATEGORIES = ["kitchen", "garden", "books", "toys", "tools", "audio"]


def make_customer(rng: random.Random, now: datetime, number: int) -> dict[str, Any]:
    return {
        "_id": ObjectId(),
        "name": f"Customer {number}",
        "email": f"customer{number}@example.com",
        "address": {"city": rng.choice(CITIES), "country": rng.choice(COUNTRIES)},
        "loyalty_points": rng.randint(0, 500),
        "marketing_opt_in": rng.random() < 0.4,
        "signed_up": now - timedelta(days=rng.randint(0, 900)),
    }


def make_product(rng: random.Random, sku: str) -> dict[str, Any]:
    return {
        "_id": sku,
        "title": f"{rng.choice(['Small', 'Large', 'Classic', 'Travel'])} "
        f"{rng.choice(['kettle', 'lamp', 'notebook', 'speaker', 'trowel', 'puzzle'])}",
        "price": Decimal128(Decimal(rng.randint(199, 19_999)) / 100),
        "stock": rng.randint(0, 250),
        "categories": rng.sample(CATEGORIES, k=rng.randint(1, 3)),
        "dimensions_cm": {"w": rng.randint(5, 60), "h": rng.randint(5, 60)},
    }


def make_shop_order(
    rng: random.Random, now: datetime, customer: ObjectId, prices: dict[str, Decimal128]
) -> dict[str, Any]:
    lines = [
        {"sku": sku, "qty": rng.randint(1, 3)}
        for sku in rng.sample(sorted(prices), min(len(prices), rng.randint(1, 3)))
    ]
    total = sum(Decimal(str(prices[line["sku"]])) * line["qty"] for line in lines)
    return {
        "_id": ObjectId(),
        "customer_id": customer,
        "lines": lines,
        "status": "new",
        "placed_at": now - timedelta(seconds=rng.randint(0, 86_400)),
        "total": Decimal128(total),
    }


def run_shop_workload(
    client: MongoClient, database: str, *, orders: int = 300, seed: int = 7
) -> dict[str, Counter[str]]:
    """One round of the shop: new customers and products, orders placing them, updates and
    deletes in each collection, and one transaction over all three (an order that takes stock
    and gives loyalty points). Returns the operations done, by collection and kind."""
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    db = client[database]
    done: dict[str, Counter[str]] = {c: Counter() for c in ("customers", "orders", "products")}

    first = db.customers.estimated_document_count()  # later rounds add new customers
    customers = [make_customer(rng, now, first + n) for n in range(max(2, orders // 3))]
    db.customers.insert_many(customers, ordered=False)
    done["customers"]["insert"] += len(customers)
    # Products are keyed by SKU: a later round's upsert of a known one updates it.
    prices = {}
    for sku in rng.sample(SKUS, k=min(len(SKUS), max(3, orders // 10))):
        product = make_product(rng, sku)
        prices[sku] = product["price"]
        kept = db.products.replace_one({"_id": sku}, product, upsert=True)
        done["products"]["insert" if kept.upserted_id is not None else "replace"] += 1

    ids = [c["_id"] for c in customers]
    placed = [make_shop_order(rng, now, rng.choice(ids), prices) for _ in range(orders)]
    db.orders.insert_many(placed, ordered=False)
    done["orders"]["insert"] += len(placed)
    order_ids = [o["_id"] for o in placed]
    statuses = [
        UpdateOne({"_id": _id}, {"$set": {"status": rng.choice(STATUSES[1:]), "updated_at": now}})
        for _id in rng.sample(order_ids, k=orders // 2)
    ]
    done["orders"]["update"] += db.orders.bulk_write(statuses, ordered=False).modified_count
    done["orders"]["delete"] += db.orders.delete_many(
        {"_id": {"$in": rng.sample(order_ids, k=max(1, orders // 20))}}
    ).deleted_count
    for _id in rng.sample(ids, k=max(1, len(ids) // 4)):
        db.customers.update_one({"_id": _id}, {"$set": {"marketing_opt_in": True}})
        done["customers"]["update"] += 1
    done["customers"]["delete"] += db.customers.delete_one({"_id": ids[-1]}).deleted_count
    for sku in rng.sample(sorted(prices), k=max(1, len(prices) // 3)):
        db.products.update_one({"_id": sku}, {"$inc": {"stock": rng.randint(10, 50)}})
        done["products"]["update"] += 1

    sku = rng.choice(sorted(prices))
    with client.start_session() as session, session.start_transaction():
        order = make_shop_order(rng, now, ids[0], {sku: prices[sku]})
        db.orders.insert_one(order, session=session)
        db.products.update_one({"_id": sku}, {"$inc": {"stock": -1}}, session=session)
        db.customers.update_one({"_id": ids[0]}, {"$inc": {"loyalty_points": 10}}, session=session)
    for name in done:
        done[name]["in the transaction"] += 1
    return done


def stream_workload(
    client: MongoClient, stream: StreamConfig, *, orders: int, seed: int
) -> dict[str, Counter[str]]:
    """A round of the workload that suits the stream, by namespace: the orders workload on a
    collection stream's collection, the shop on a database stream's database; a cluster stream
    gets none (it has no database to write to)."""
    if stream.scope == "collection":
        assert stream.database and stream.collection
        done = run_workload(client, stream.database, stream.collection, orders=orders, seed=seed)
        return {stream.namespace: done}
    if stream.scope == "database":
        assert stream.database
        shop = run_shop_workload(client, stream.database, orders=orders, seed=seed)
        return {f"{stream.database}.{coll}": ops for coll, ops in shop.items()}
    return {}
