"""Attacks on commit order with prepared transactions (merge s8-twopc: per-key lock modes, the
prepare gates and the per-stripe marks of a waiting bulk commit, DESIGN.md "Commit order"), by a
role with only EXECUTE on outbox.enqueue (PREPARE TRANSACTION allowed). max_locks_per_transaction
is low, so a bulk commit (the global Exclusive path) needs only 9 keys. Each test fails if its
attack works."""

import psycopg
import pytest

from harness.lock_waits import InThread, waiting_on_lock
from harness.pg_cluster import PgCluster
from harness.wait import wait_until
from test_attack_commit_order import enqueue_many, key_hash, waiting_for
from test_commit_order import (APP, KEY_LOCK_CLASS, PREPARE_GATE_CLASS, create_roles, enqueue, key_lock_limit,
                               our_locks_of, our_locks_of_prepared, published_order, session)
from test_commit_order import topic  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "20",
                             "max_locks_per_transaction": "16"}) as cluster:
        create_roles(cluster)
        yield cluster


@pytest.fixture(autouse=True)
def no_prepared_left(pg):
    """A failed attack may leave a prepared transaction behind, holding our locks: roll it back."""
    yield
    for (gid,) in pg.sql("SELECT gid FROM pg_prepared_xacts"):
        pg.sql(f"ROLLBACK PREPARED '{gid}'")


def stripe(pg, topic, key):
    return key_hash(pg, topic, key) & 0xFFFF


def bulk_keys(pg, prefix):
    return [f"{prefix}{i}" for i in range(1, key_lock_limit(pg) + 2)]


def enqueue_bulk(c, topic, prefix, label, pg):
    c.execute("BEGIN")
    c.execute("SELECT count(outbox.enqueue(%s, %s || i, %s::text)) FROM generate_series(1, %s) i",
              (topic, prefix, label, key_lock_limit(pg) + 1))


def key_on_stripes(pg, topic, wanted, unwanted=frozenset(), prefix="v"):
    """A key of the topic whose stripe is in `wanted` and not in `unwanted` (commit_order.cpp: the
    stripe is the low 16 bits of the key's 64-bit hash)."""
    rows = pg.sql("SELECT k, hashtextextended(k COLLATE \"C\", hashtextextended(%s COLLATE \"C\", 0)) & 65535 "
                  "FROM (SELECT %s || i AS k FROM generate_series(1, 2000000) i) keys "
                  "WHERE hashtextextended(k COLLATE \"C\", hashtextextended(%s COLLATE \"C\", 0)) & 65535 = ANY(%s)",
                  (topic, prefix, topic, list(wanted)))
    return next(k for k, s in rows if s not in unwanted)


def prepare(c, topic, key, label, gid):
    c.execute("BEGIN")
    enqueue(c, topic, key, label)
    c.execute(f"PREPARE TRANSACTION '{gid}'")


def gone(pg, gid):
    return not pg.value("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,))


def end_left(pg, gids, threads, how="COMMIT"):
    """After a test, passed or not: ends the prepared transactions still there, joins the threads."""
    for g in gids:
        if not gone(pg, g):
            pg.sql(f"{how} PREPARED '{g}'")
    for t in threads:
        if t is not None:
            t.thread.join(60)


# -- a prepare gate per waiting bulk commit (it was one lock for all of them) ----------------------

def test_a_prepare_waits_only_for_the_bulk_commit_whose_stripe_it_shares(pg, topic):
    # Attacker: Pa prepared with a1 and left; Ma (a1 .. a9) waits for it, with lock_timeout 0.
    # Victim: Mb (b1 .. b9) waits for Pb's b1 a moment; P prepares v, which shares a stripe with
    # Mb's keys and none with Ma's. DESIGN.md: a waiting bulk commit holds up "of PREPAREs only
    # those of its keys, or of keys sharing a stripe with one of them". Once Mb is done, P should
    # go on. With one gate for all bulk commits it waited for Ma too, that is for the attacker's
    # Pa, for ever (here: its lock_timeout); now it waits at Mb's gate alone.
    ga, gb, gp = "ga-" + topic, "gb-" + topic, "gp-" + topic
    a_stripes = {stripe(pg, topic, k) for k in bulk_keys(pg, "a")}
    b_stripes = {stripe(pg, topic, k) for k in bulk_keys(pg, "b")} - a_stripes
    v = key_on_stripes(pg, topic, b_stripes, a_stripes)
    pa, pb, ma, mb = session(pg, APP), session(pg, APP), session(pg, APP, "0"), session(pg, APP)
    p = session(pg, APP, "10s")
    with pa, pb, ma, mb, p:
        prepare(pa, topic, "a1", "Pa", ga)
        prepare(pb, topic, "b1", "Pb", gb)
        enqueue_bulk(ma, topic, "a", "Ma", pg)
        enqueue_bulk(mb, topic, "b", "Mb", pg)
        ca, cb, preparing = InThread(ma, "COMMIT"), InThread(mb, "COMMIT"), None
        try:
            wait_until(lambda: waiting_for(pg, ma, KEY_LOCK_CLASS), what="Ma waiting for Pa's a1")
            wait_until(lambda: waiting_for(pg, mb, KEY_LOCK_CLASS), what="Mb waiting for Pb's b1")
            p.execute("BEGIN")
            enqueue(p, topic, v, "P")
            preparing = InThread(p, f"PREPARE TRANSACTION '{gp}'")
            wait_until(lambda: waiting_for(pg, p, PREPARE_GATE_CLASS), what="P waiting at the gate for Mb")
            pg.sql(f"COMMIT PREPARED '{gb}'")
            cb.join()
            preparing.thread.join(60)
            error = preparing.error
        finally:
            pg.sql(f"COMMIT PREPARED '{ga}'")
            ca.join()
            if preparing is not None:
                preparing.thread.join(60)
                if not gone(pg, gp):
                    pg.sql(f"COMMIT PREPARED '{gp}'")
    assert error is None, f"P waited for the attacker's bulk commit, whose stripes it does not share: {error!r}"
    assert published_order(pg, topic, v) == ["P"]


def gate_holder(pg, c):
    """The pid holding the prepare gate session c waits at (None: it waits at none)."""
    return pg.value(f"""SELECT h.pid FROM pg_locks w JOIN pg_locks h
                        ON (h.locktype, h.database, h.classid, h.objid, h.objsubid)
                         = (w.locktype, w.database, w.classid, w.objid, w.objsubid) AND h.granted
                        WHERE w.pid = %s AND NOT w.granted AND w.objsubid = {PREPARE_GATE_CLASS}""",
                    (c.info.backend_pid,))


def test_a_prepare_waits_for_every_bulk_commit_that_marked_its_stripe(pg, topic):
    # M1 (k1 .. k9, s) waits for Pk's k1, M2 (j1 .. j9, s) for Pj's j1; P's PREPARE of s looks after
    # both marked s. It must wait at both gates: let past the first, it would prepare s and the
    # other M would wait for it, overtaken by a PREPARE that came after it marked. Whichever gate P
    # waits at first, that M's key is released first, and P must then wait at the other's gate.
    gk, gj, gp = "bk-" + topic, "bj-" + topic, "bp-" + topic
    pk, pj, m1, m2, p = (session(pg, APP), session(pg, APP), session(pg, APP, "10s"), session(pg, APP, "10s"),
                         session(pg, APP))
    with pk, pj, m1, m2, p:
        prepare(pk, topic, "k1", "Pk", gk)
        prepare(pj, topic, "j1", "Pj", gj)
        for c, prefix, label in ((m1, "k", "M1"), (m2, "j", "M2")):
            enqueue_bulk(c, topic, prefix, label, pg)
            enqueue(c, topic, "s", label)
        c1, c2, preparing = InThread(m1, "COMMIT"), InThread(m2, "COMMIT"), None
        try:
            wait_until(lambda: waiting_for(pg, m1, KEY_LOCK_CLASS), what="M1 waiting for Pk's k1")
            wait_until(lambda: waiting_for(pg, m2, KEY_LOCK_CLASS), what="M2 waiting for Pj's j1")
            p.execute("BEGIN")
            enqueue(p, topic, "s", "P")
            preparing = InThread(p, f"PREPARE TRANSACTION '{gp}'")
            first_pid = wait_until(lambda: gate_holder(pg, p), what="P waiting at a gate")
            by_pid = {m1.info.backend_pid: (gk, c1, "M1"), m2.info.backend_pid: (gj, c2, "M2")}
            (g_first, c_first, first), = [v for pid, v in by_pid.items() if pid == first_pid]
            (g_second, c_second, second), = [v for pid, v in by_pid.items() if pid != first_pid]
            second_pid = next(pid for pid in by_pid if pid != first_pid)
            pg.sql(f"COMMIT PREPARED '{g_first}'")
            c_first.join()
            wait_until(lambda: gate_holder(pg, p) == second_pid or not preparing.thread.is_alive(),
                       what="P waiting at the second gate, or prepared")
            assert preparing.thread.is_alive(), f"P prepared while {second} waited with s marked"
            pg.sql(f"COMMIT PREPARED '{g_second}'")
            c_second.join()
            preparing.join()
        finally:
            end_left(pg, (gk, gj), (c1, c2, preparing))
            if not gone(pg, gp):
                pg.sql(f"COMMIT PREPARED '{gp}'")
    assert published_order(pg, topic, "s") == [first, second, "P"]


def test_a_bulk_commit_stuck_at_a_prepared_key_holds_up_no_other_bulk_commit(pg, topic):
    # Attacker: Pa prepared with a1 and left; Ma (a1 .. a9) waits for it, and P's PREPARE of a key
    # on one of Ma's stripes waits at the gate (documented; P can be the attacker's own, with
    # lock_timeout 0). README: the waiting bulk commit holds up "meanwhile no commit"; but a bulk
    # commit of unrelated keys, c1 .. c9, none of them held, asks for the gate in RowExclusive
    # mode behind P's Share request, which waits for Ma: it waited for Pa too, and so did every
    # bulk commit of the database. Now a bulk commit takes the gate only at its first busy key.
    ga, gp = "sa-" + topic, "sp-" + topic
    v = key_on_stripes(pg, topic, {stripe(pg, topic, "a2")})
    pa, ma, p, mc = session(pg, APP), session(pg, APP, "0"), session(pg, APP), session(pg, APP, "5s")
    with pa, ma, p, mc:
        prepare(pa, topic, "a1", "Pa", ga)
        enqueue_bulk(ma, topic, "a", "Ma", pg)
        ca, preparing, error = InThread(ma, "COMMIT"), None, None
        try:
            wait_until(lambda: waiting_for(pg, ma, KEY_LOCK_CLASS), what="Ma waiting for Pa's a1")
            p.execute("BEGIN")
            enqueue(p, topic, v, "P")
            preparing = InThread(p, f"PREPARE TRANSACTION '{gp}'")
            wait_until(lambda: waiting_for(pg, p, PREPARE_GATE_CLASS), what="P waiting at the gate for Ma")
            enqueue_bulk(mc, topic, "c", "Mc", pg)
            try:
                mc.execute("COMMIT")
            except psycopg.errors.LockNotAvailable as e:
                error = e
        finally:
            pg.sql(f"COMMIT PREPARED '{ga}'")
            ca.join()
            if preparing is not None:
                preparing.join()
                pg.sql(f"COMMIT PREPARED '{gp}'")
    assert error is None, f"a bulk commit of unrelated keys waited for the attacker's prepared transaction: {error}"
    assert published_order(pg, topic, "c1") == ["Mc"]
    assert published_order(pg, topic, "a1") == ["Pa", "Ma"]


def test_a_bulk_commit_stuck_at_a_prepared_key_holds_up_no_bulk_commit_waiting_for_another(pg, topic):
    # As above, but the victim Mc (c1 .. c9) must wait a moment for Pc's c1. With one gate it asked
    # for it behind P, which waits for Ma, which waits for the attacker's Pa; now it takes a gate
    # of its own, which nobody else asks for. Once Pc commits, Mc should go on.
    ga, gc, gp = "wa-" + topic, "wc-" + topic, "wp-" + topic
    v = key_on_stripes(pg, topic, {stripe(pg, topic, "a2")})
    pa, pc, ma, p, mc = (session(pg, APP), session(pg, APP), session(pg, APP, "0"), session(pg, APP),
                         session(pg, APP, "10s"))
    with pa, pc, ma, p, mc:
        prepare(pa, topic, "a1", "Pa", ga)
        prepare(pc, topic, "c1", "Pc", gc)
        enqueue_bulk(ma, topic, "a", "Ma", pg)
        ca, preparing, cc = InThread(ma, "COMMIT"), None, None
        try:
            wait_until(lambda: waiting_for(pg, ma, KEY_LOCK_CLASS), what="Ma waiting for Pa's a1")
            p.execute("BEGIN")
            enqueue(p, topic, v, "P")
            preparing = InThread(p, f"PREPARE TRANSACTION '{gp}'")
            wait_until(lambda: waiting_for(pg, p, PREPARE_GATE_CLASS), what="P waiting at the gate for Ma")
            enqueue_bulk(mc, topic, "c", "Mc", pg)
            cc = InThread(mc, "COMMIT")
            wait_until(lambda: not cc.thread.is_alive() or waiting_on_lock(pg, mc), what="Mc waiting")
            pg.sql(f"COMMIT PREPARED '{gc}'")
            cc.thread.join(60)
            error = cc.error
        finally:
            if not gone(pg, gc):
                pg.sql(f"COMMIT PREPARED '{gc}'")
            pg.sql(f"COMMIT PREPARED '{ga}'")
            ca.join()
            if cc is not None:
                cc.thread.join(60)
            if preparing is not None:
                preparing.join()
                pg.sql(f"COMMIT PREPARED '{gp}'")
    assert error is None, f"Mc waited for the attacker's prepared transaction after its own key was free: {error!r}"
    assert published_order(pg, topic, "c1") == ["Pc", "Mc"]


# -- a role that loops PREPARE + ROLLBACK PREPARED ------------------------------------------------

def test_prepare_and_rollback_prepared_in_a_loop_do_not_starve_a_bulk_commit(pg, topic):
    # P0 prepared k1; P1's PREPARE of k1 queued behind it (Exclusive waiter) before the bulk commit
    # M (k1 .. k9) tries: M waits behind P1. P2's PREPARE of k1 comes after M marked its stripes: it
    # waits at the gate. Rolling back P0, then P1, lets M through before P2.
    g0, g1, g2 = "r0-" + topic, "r1-" + topic, "r2-" + topic
    p0, p1, p2, m = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, APP)
    with p0, p1, p2, m:
        prepare(p0, topic, "k1", "P0", g0)
        p1.execute("BEGIN")
        enqueue(p1, topic, "k1", "P1")
        prep1 = InThread(p1, f"PREPARE TRANSACTION '{g1}'")
        committer = prep2 = None
        try:
            wait_until(lambda: waiting_for(pg, p1, KEY_LOCK_CLASS), what="P1's PREPARE waiting for P0's k1")
            enqueue_bulk(m, topic, "k", "M", pg)
            committer = InThread(m, "COMMIT")
            wait_until(lambda: waiting_for(pg, m, KEY_LOCK_CLASS), what="M waiting for k1 behind P1")
            p2.execute("BEGIN")
            enqueue(p2, topic, "k1", "P2")
            prep2 = InThread(p2, f"PREPARE TRANSACTION '{g2}'")
            wait_until(lambda: waiting_for(pg, p2, PREPARE_GATE_CLASS), what="P2's PREPARE waiting at the gate")
            pg.sql(f"ROLLBACK PREPARED '{g0}'")
            prep1.join()
            assert committer.thread.is_alive(), "M went before P1, which it queued behind"
            pg.sql(f"ROLLBACK PREPARED '{g1}'")
            committer.join()
            prep2.join()
        finally:
            end_left(pg, (g0, g1), (prep1, committer, prep2), "ROLLBACK")
        pg.sql(f"COMMIT PREPARED '{g2}'")
    assert published_order(pg, topic, "k1") == ["M", "P2"]
    assert published_order(pg, topic, "k2") == ["M"]


def test_prepare_and_rollback_prepared_in_a_loop_do_not_starve_a_commit_of_the_key(pg, topic):
    # P0 prepared k; T's commit of k waits for it; P1's PREPARE of k comes after T queued: it queues
    # behind T (FIFO), so rolling back P0 lets T commit before P1 gets the key.
    g0, g1 = "f0-" + topic, "f1-" + topic
    p0, p1, t = session(pg, APP), session(pg, APP), session(pg, APP)
    with p0, p1, t:
        prepare(p0, topic, "k", "P0", g0)
        t.execute("BEGIN")
        enqueue(t, topic, "k", "T")
        enqueue(t, topic, "other", "T")
        committer = InThread(t, "COMMIT")
        prep1 = None
        try:
            wait_until(lambda: waiting_for(pg, t, KEY_LOCK_CLASS), what="T waiting for P0's k")
            p1.execute("BEGIN")
            enqueue(p1, topic, "k", "P1")
            prep1 = InThread(p1, f"PREPARE TRANSACTION '{g1}'")
            wait_until(lambda: waiting_for(pg, p1, KEY_LOCK_CLASS), what="P1 waiting for k behind T")
            pg.sql(f"ROLLBACK PREPARED '{g0}'")
            committer.join()
            prep1.join()
        finally:
            if not gone(pg, g0):
                pg.sql(f"ROLLBACK PREPARED '{g0}'")
            committer.thread.join(60)
            if prep1 is not None:
                prep1.thread.join(60)
        pg.sql(f"COMMIT PREPARED '{g1}'")
    assert published_order(pg, topic, "k") == ["T", "P1"]


# -- a bulk commit cancelled while it waits: its marks go with it ---------------------------------

def test_a_cancelled_bulk_commit_leaves_no_mark_behind(pg, topic):
    # M (k1 .. k9) waits for P0's k1 and is cancelled (pg_cancel_backend, by the server owner: the
    # application role's own client would send the same cancel). A PREPARE of k2 (one of M's keys,
    # so its stripe was marked) must then not wait at the gate: lock_timeout 5 s, and a bulk
    # commit of other keys (j1 .. j9) waiting for P0's j1 holds the gate meanwhile.
    g0, g1 = "c0-" + topic, "c1-" + topic
    j_stripes = {stripe(pg, topic, k) for k in bulk_keys(pg, "j")}
    victim = next(k for k in bulk_keys(pg, "k")[1:] if stripe(pg, topic, k) not in j_stripes)
    p0, m, m2, p1 = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, APP, "5s")
    with p0, m, m2, p1:
        p0.execute("BEGIN")
        enqueue(p0, topic, "k1", "P0")
        enqueue(p0, topic, "j1", "P0")
        p0.execute(f"PREPARE TRANSACTION '{g0}'")
        committer = None
        try:
            enqueue_bulk(m, topic, "k", "M", pg)
            failing = InThread(m, "COMMIT")
            wait_until(lambda: waiting_for(pg, m, KEY_LOCK_CLASS), what="M waiting for k1")
            pg.sql("SELECT pg_cancel_backend(%s)", (m.info.backend_pid,))
            failing.thread.join(60)
            assert isinstance(failing.error, psycopg.errors.QueryCanceled), failing.error
            assert our_locks_of(pg, m) == {}
            m.execute("ROLLBACK")
            enqueue_bulk(m2, topic, "j", "M2", pg)
            committer = InThread(m2, "COMMIT")
            wait_until(lambda: waiting_for(pg, m2, KEY_LOCK_CLASS), what="M2 waiting for j1")
            prepare(p1, topic, victim, "P1", g1)
        finally:
            pg.sql(f"COMMIT PREPARED '{g0}'")
            if committer is not None:
                committer.thread.join(60)
        committer.join()
        pg.sql(f"COMMIT PREPARED '{g1}'")
    assert published_order(pg, topic, victim) == ["P1"]
    assert published_order(pg, topic, "j1") == ["P0", "M2"]


# -- stripe collisions ----------------------------------------------------------------------------

def test_a_prepare_of_a_stripe_mate_waits_for_the_bulk_commit_and_order_holds(pg, topic):
    # v shares a stripe with k2, one of the bulk commit M's keys (not its lock). P's PREPARE of v
    # waits at the gate while M waits for P0 (documented), and goes once M is done. T enqueued v
    # before P and commits after P's COMMIT PREPARED: it sorts after P (the shared stripe costs a
    # re-stamp at most, never order).
    g0, gp = "m0-" + topic, "mp-" + topic
    v = key_on_stripes(pg, topic, {stripe(pg, topic, "k2")})
    p0, m, p, t = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, APP)
    with p0, m, p, t:
        t.execute("BEGIN")
        enqueue(t, topic, v, "T")  # enqueued first, committed last: re-stamped above P's stripe
        prepare(p0, topic, "k1", "P0", g0)
        enqueue_bulk(m, topic, "k", "M", pg)
        committer, preparing = InThread(m, "COMMIT"), None
        try:
            wait_until(lambda: waiting_for(pg, m, KEY_LOCK_CLASS), what="M waiting for P0's k1")
            p.execute("BEGIN")
            enqueue(p, topic, v, "P")
            preparing = InThread(p, f"PREPARE TRANSACTION '{gp}'")
            wait_until(lambda: waiting_for(pg, p, PREPARE_GATE_CLASS), what="P (v) waiting at the gate")
            pg.sql(f"COMMIT PREPARED '{g0}'")
            committer.join()
            preparing.join()
        finally:
            if not gone(pg, g0):
                pg.sql(f"COMMIT PREPARED '{g0}'")
            committer.thread.join(60)
            if preparing is not None:
                preparing.thread.join(60)
        assert our_locks_of_prepared(pg, gp) == {KEY_LOCK_CLASS: 1}
        pg.sql(f"COMMIT PREPARED '{gp}'")
        t.execute("COMMIT")
    assert published_order(pg, topic, v) == ["P", "T"]
    assert published_order(pg, topic, "k1") == ["P0", "M"]


# -- a crash with a bulk commit waiting and PREPAREs pending --------------------------------------

def test_a_crash_with_a_bulk_commit_waiting_keeps_order_and_no_mark(pg, topic):
    # A commits k1 between P0's enqueue and its PREPARE (P0 re-stamped); M (k1 .. k9) waits for
    # P0; P1's PREPARE of k2 waits at the gate. Immediate stop. After the restart P0 still holds
    # k1 (and only that); M and P1 are gone, and so are the marks: a PREPARE of k2 goes at once.
    # C commits k1 after COMMIT PREPARED: A, P0, C.
    g0, g1, g2 = "x0-" + topic, "x1-" + topic, "x2-" + topic
    p0, a, m, p1 = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, APP)
    p0.execute("BEGIN")
    enqueue(p0, topic, "k1", "P0")
    enqueue(a, topic, "k1", "A")
    p0.execute(f"PREPARE TRANSACTION '{g0}'")
    enqueue_bulk(m, topic, "k", "M", pg)
    committer = InThread(m, "COMMIT")
    wait_until(lambda: waiting_for(pg, m, KEY_LOCK_CLASS), what="M waiting for P0's k1")
    p1.execute("BEGIN")
    enqueue(p1, topic, "k2", "P1")
    preparing = InThread(p1, f"PREPARE TRANSACTION '{g1}'")
    wait_until(lambda: waiting_for(pg, p1, PREPARE_GATE_CLASS), what="P1 waiting at the gate")
    pg.stop("immediate")
    committer.thread.join(60)
    preparing.thread.join(60)
    for c in (p0, a, m, p1):
        c.close()
    pg.start()
    assert our_locks_of_prepared(pg, g0) == {KEY_LOCK_CLASS: 1}
    assert gone(pg, g1)
    with session(pg, APP, "5s") as p2, session(pg, APP) as c:
        prepare(p2, topic, "k2", "P2", g2)
        c.execute("BEGIN")
        enqueue(c, topic, "k1", "C")
        waiting = InThread(c, "COMMIT")
        try:
            wait_until(lambda: waiting_for(pg, c, KEY_LOCK_CLASS), what="C waiting for P0")
        finally:
            pg.sql(f"COMMIT PREPARED '{g0}'")
        waiting.join()
        pg.sql(f"COMMIT PREPARED '{g2}'")
    assert published_order(pg, topic, "k1") == ["A", "P0", "C"]
    assert published_order(pg, topic, "k2") == ["P2"]
    assert not pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s AND convert_from(payload, 'UTF8') = 'M'",
                        (topic,))
