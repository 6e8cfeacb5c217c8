-- The schema of a version-2 store, as the front-end wrote it before the migrations (commit 99cbae6): the
-- store's tables, then the standard filters' tables, then the meta rows it set.
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS streams (
    stream_id INTEGER PRIMARY KEY,
    name TEXT,
    filter TEXT,
    params TEXT,
    sync_mode TEXT,
    timeout_ms INTEGER,
    state TEXT,
    failure TEXT,
    opened_unix_ns INTEGER,
    closed_unix_ns INTEGER,
    result_type TEXT,
    ranks TEXT
);
CREATE TABLE IF NOT EXISTS rounds (
    stream_id INTEGER NOT NULL,
    stream_name TEXT,
    round INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    expected INTEGER NOT NULL,
    missing_late INTEGER NOT NULL DEFAULT 0,
    missing_lost INTEGER NOT NULL DEFAULT 0,
    missing_stopped INTEGER NOT NULL DEFAULT 0,
    missing_sampled_out INTEGER NOT NULL DEFAULT 0,
    missing_malformed INTEGER NOT NULL DEFAULT 0,
    missing_not_waited INTEGER NOT NULL DEFAULT 0,
    missing_dropped INTEGER NOT NULL DEFAULT 0,
    missing_unspecified INTEGER NOT NULL DEFAULT 0,
    missing_reason TEXT,
    late_ranks INTEGER NOT NULL DEFAULT 0,
    result_bytes INTEGER NOT NULL DEFAULT 0,
    pieces INTEGER NOT NULL DEFAULT 1,
    first_dump_unix_ns INTEGER,
    closed_unix_ns INTEGER,
    PRIMARY KEY (stream_id, round)
);
CREATE TABLE IF NOT EXISTS samples (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    calls INTEGER,
    subrs INTEGER,
    incl_us REAL,
    excl_us REAL,
    calls_total INTEGER,
    subrs_total INTEGER,
    incl_total_us REAL,
    excl_total_us REAL,
    dump_unix_ns INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS samples_by_round ON samples (stream_id, round);
CREATE TABLE IF NOT EXISTS counters (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    counter_id INTEGER NOT NULL,
    value REAL,
    total REAL,
    dump_unix_ns INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS counters_by_round ON counters (stream_id, round);
CREATE TABLE IF NOT EXISTS results (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    phase INTEGER NOT NULL,
    payload BLOB,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS results_by_round ON results (stream_id, round);
CREATE TABLE IF NOT EXISTS names (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS name_collisions (
    id INTEGER NOT NULL,
    existing TEXT NOT NULL,
    new TEXT NOT NULL,
    seen_unix_ns INTEGER,
    UNIQUE (id, existing, new)
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    kind TEXT,
    parent TEXT,
    state TEXT,
    ranks_below INTEGER,
    address TEXT,
    detail TEXT,
    first_seen_unix_ns INTEGER,
    updated_unix_ns INTEGER
);
CREATE TABLE IF NOT EXISTS late_arrivals (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    ranks INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    arrived_unix_ns INTEGER
);
CREATE INDEX IF NOT EXISTS late_arrivals_by_round ON late_arrivals (stream_id, round);
CREATE TABLE IF NOT EXISTS stats (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    count INTEGER NOT NULL,
    mean REAL,
    std REAL,
    min REAL,
    max REAL,
    min_app TEXT,
    min_rank INTEGER,
    max_app TEXT,
    max_rank INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS stats_by_round ON stats (stream_id, round);
CREATE TABLE IF NOT EXISTS histograms (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    bin INTEGER NOT NULL,
    lo REAL,
    hi REAL,
    count INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS histograms_by_round ON histograms (stream_id, round);
CREATE TABLE IF NOT EXISTS classes (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    size INTEGER NOT NULL,
    ranks TEXT NOT NULL,
    example_event TEXT,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS classes_by_round ON classes (stream_id, round);
CREATE TABLE IF NOT EXISTS reductions (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    raw_bytes INTEGER NOT NULL,
    result_bytes INTEGER NOT NULL,
    reduction_factor REAL,
    classes INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS reductions_by_round ON reductions (stream_id, round);
INSERT INTO meta (key, value) VALUES ('schema_version', '2');
INSERT INTO meta (key, value) VALUES ('started_unix_ns', '1700000000000000000');
INSERT INTO meta (key, value) VALUES ('pid', '4242');
