"""One SQLite writer for the coherence tests (integration/coherence_test.go).

usage: sqlite_writer.py DB WRITER ROWS JOURNAL_MODE

Keeps one connection open (so that a stale kernel cache would be used) and
commits ROWS rows (WRITER, i), each in its own IMMEDIATE transaction,
retrying a busy database. Prints "committed N" and exits 0, or prints the
SQLite error and exits 2 (a corrupt database, a disk I/O error).
"""
import sqlite3
import sys
import time

db, writer, rows, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
con = sqlite3.connect(db, timeout=60, isolation_level=None)
got = con.execute("PRAGMA journal_mode=%s" % mode).fetchone()[0]
if got.lower() != mode.lower():
    print("journal_mode is %s, want %s" % (got, mode), flush=True)
    sys.exit(2)
committed = 0
try:
    for i in range(rows):
        while True:
            try:
                con.execute("BEGIN IMMEDIATE")
                con.execute("INSERT INTO t VALUES (?, ?)", (writer, i))
                con.execute("COMMIT")
                committed += 1
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if con.in_transaction:
                    con.execute("ROLLBACK")
                time.sleep(0.001)
except sqlite3.DatabaseError as e:
    print("error after %d commits: %s" % (committed, e), flush=True)
    sys.exit(2)
print("committed %d" % committed, flush=True)
