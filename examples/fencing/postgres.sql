-- SPDX-License-Identifier: MIT
-- dlock fencing at the resource: PostgreSQL (docs/fencing.md).
--
-- One row per protected resource holds the highest fencing token that
-- has written to it. A writer's transaction records its token first;
-- the trigger refuses a token lower than the row's, which aborts the
-- whole transaction: a holder that was paused past its lease, and whose
-- lock another holder took meanwhile, writes nothing.
--
--   BEGIN;
--   INSERT INTO dlock_fence (resource, token) VALUES ('accounts:42', $1)
--       ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token;
--   UPDATE accounts SET balance = balance - 10 WHERE id = 42;
--   COMMIT;
--
-- $1 is the holder's token (dlock_token(), $DLOCK_TOKEN). The upsert
-- locks the row until the transaction ends, so writers of one resource
-- take turns and a stale one cannot slip in between the check and its
-- writes. The same token may write any number of times.
CREATE TABLE IF NOT EXISTS dlock_fence (
    resource text PRIMARY KEY,
    token bigint NOT NULL CHECK (token >= 0)
);

CREATE OR REPLACE FUNCTION dlock_fence_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.token < OLD.token THEN
        RAISE EXCEPTION 'dlock: stale fencing token % for %: % has written',
            NEW.token, OLD.resource, OLD.token
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS dlock_fence_guard ON dlock_fence;
CREATE TRIGGER dlock_fence_guard BEFORE UPDATE ON dlock_fence
    FOR EACH ROW EXECUTE FUNCTION dlock_fence_guard();
