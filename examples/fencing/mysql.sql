-- SPDX-License-Identifier: MIT
-- dlock fencing at the resource: MySQL / MariaDB (docs/fencing.md).
--
-- One row per protected resource holds the highest fencing token that
-- has written to it. A writer's transaction records its token first;
-- the trigger refuses a token lower than the row's (SQLSTATE 45000),
-- and the writer rolls its transaction back: a holder that was paused
-- past its lease, and whose lock another holder took meanwhile, writes
-- nothing.
--
--   START TRANSACTION;
--   INSERT INTO dlock_fence (resource, token) VALUES ('accounts:42', ?)
--       ON DUPLICATE KEY UPDATE token = VALUES(token);
--   UPDATE accounts SET balance = balance - 10 WHERE id = 42;
--   COMMIT;
--
-- ? is the holder's token (dlock_token(), $DLOCK_TOKEN). A failed
-- statement does not end a MySQL transaction by itself: on the error,
-- ROLLBACK (every driver's transaction helper does). The upsert locks
-- the row until the transaction ends (InnoDB), so writers of one
-- resource take turns. The same token may write any number of times.
CREATE TABLE IF NOT EXISTS dlock_fence (
    resource VARCHAR(255) NOT NULL PRIMARY KEY,
    token BIGINT UNSIGNED NOT NULL
) ENGINE = InnoDB;

DROP TRIGGER IF EXISTS dlock_fence_guard;
-- (the mysql client reads the trigger's body whole between DELIMITERs)
DELIMITER //
CREATE TRIGGER dlock_fence_guard BEFORE UPDATE ON dlock_fence
FOR EACH ROW
BEGIN
    IF NEW.token < OLD.token THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'dlock: stale fencing token';
    END IF;
END//
DELIMITER ;
