-- SPDX-License-Identifier: MIT
-- dlock fencing at the resource: SQLite (docs/fencing.md).
--
-- One row per protected resource holds the highest fencing token that
-- has written to it. A writer's transaction records its token first;
-- the trigger refuses a token lower than the row's (RAISE(ABORT)), and
-- the writer rolls its transaction back: a holder that was paused past
-- its lease, and whose lock another holder took meanwhile, writes
-- nothing.
--
--   BEGIN IMMEDIATE;
--   INSERT INTO dlock_fence (resource, token) VALUES ('accounts:42', ?)
--       ON CONFLICT (resource) DO UPDATE SET token = excluded.token;
--   UPDATE accounts SET balance = balance - 10 WHERE id = 42;
--   COMMIT;
--
-- ? is the holder's token (dlock_token(), $DLOCK_TOKEN). BEGIN
-- IMMEDIATE takes the database's write lock first, so writers take
-- turns. The same token may write any number of times. (Tokens above
-- 2^63 - 1 do not fit an SQLite integer; dlock's stores give less.)
CREATE TABLE IF NOT EXISTS dlock_fence (
    resource TEXT PRIMARY KEY,
    token INTEGER NOT NULL CHECK (token >= 0)
);

CREATE TRIGGER IF NOT EXISTS dlock_fence_guard BEFORE UPDATE ON dlock_fence
WHEN NEW.token < OLD.token
BEGIN
    SELECT RAISE(ABORT, 'dlock: stale fencing token');
END;
