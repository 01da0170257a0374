-- A least-privilege PostgreSQL role for outboxd (the CDC source).
--
-- What outboxd needs, and nothing more:
--   LOGIN REPLICATION   log in, open a replication connection, create and use
--                       its logical replication slot (pgoutput);
--   CONNECT             to the database of the outbox table;
--   USAGE on the schema to resolve the outbox table by name in the preflight
--                       checks (the catalogs it reads are readable by all).
-- It needs no privilege on the outbox table itself: pgoutput decodes the
-- table's rows from the WAL, and the publication below is created here, by
-- the table's owner, because CREATE PUBLICATION ... FOR TABLE requires
-- owning the table. Start outboxd with this role as usual: it creates the
-- slot itself (REPLICATION suffices) and finds the publication in place.
--
-- Not superuser, not CREATEDB/CREATEROLE, no ownership of anything.
--
-- That is enough for outboxd run and nothing else that touches the table's
-- rows. What each command needs on top of LOGIN, CONNECT and USAGE above
-- (from the statements each one runs):
--
--   command                   needs
--   run (CDC, the default)    REPLICATION; SELECT on outbox_emit_key when
--                             installed (granted below); nothing on the outbox
--                             table
--   run --retention D,        DELETE, and SELECT (id, created_at) on the table
--   prune --older-than D      (the DELETE's WHERE reads them); with
--                             --source=poll also SELECT (published_at), which
--                             the polling source's grant includes
--   run --source=poll         SELECT, UPDATE (published_at) on the table; no
--                             REPLICATION, no publication
--   replay                    SELECT on the table (the columns it maps);
--                             REPLICATION to read the server's identity when
--                             checkpoints are on; --resume: what run needs
--   checkpoint reset          REPLICATION (creates a missing slot, reads the
--                             server's WAL history); UPDATE on the id column's
--                             sequence (setval) and SELECT or USAGE on it
--                             (pg_sequence_last_value)
--   audit                     SELECT on the table (the columns it compares);
--                             --repair: the same (it republishes as replay)
--   status                    nothing more (the catalogs and the slot's row
--                             are readable by all)
--   migrate                   ownership: it creates and alters the outbox
--                             table, outbox_emit_key and the outbox_emit
--                             functions; run it as the schema's and tables'
--                             owner, not as this role
--
-- The optional grants for each are at the end of this file, commented out:
-- uncomment the ones for the commands this role will run.
--
-- Run it as a superuser (or as the outbox table's owner with CREATEROLE), in
-- the database that holds the outbox table:
--
--   psql -d mydb -v role=outboxd -v publication=outboxd -f deploy/least-privilege.sql
--
-- Variables (all optional): role (outboxd), schema (public), table (outbox),
-- publication (outboxd). It sets no password, on purpose: this file lives in
-- git. Give the role its secret out of band, for instance in psql with
--   \password outboxd
-- or authenticate it by client certificate (pg_hba.conf "hostssl ... cert"),
-- and allow replication connections for it in pg_hba.conf:
--   hostssl replication outboxd 10.0.0.0/8 scram-sha-256
--   hostssl mydb        outboxd 10.0.0.0/8 scram-sha-256
-- outboxd connects with the same DSN for both (sslmode=verify-full advised).
\set ON_ERROR_STOP on
\if :{?role}
\else
  \set role outboxd
\endif
\if :{?schema}
\else
  \set schema public
\endif
\if :{?table}
\else
  \set table outbox
\endif
\if :{?publication}
\else
  \set publication outboxd
\endif

BEGIN;
CREATE ROLE :"role" LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
GRANT CONNECT ON DATABASE :"DBNAME" TO :"role";
GRANT USAGE ON SCHEMA :"schema" TO :"role";
-- Inserts only: outboxd publishes INSERTs; updates and deletes of outbox rows
-- (cleanup jobs) are not decoded for it.
CREATE PUBLICATION :"publication" FOR TABLE :"schema".:"table" WITH (publish = 'insert');
-- The keys outbox_emit signs its messages with (migrations 007, 008), when
-- installed: outboxd verifies each message with it and refuses to start
-- without it. Nobody else should read it.
SELECT format('GRANT SELECT ON %I.outbox_emit_key TO %I', :'schema', :'role')
WHERE to_regclass(format('%I.outbox_emit_key', :'schema')) IS NOT NULL \gexec
COMMIT;

-- Optional grants, one block per command (see the table at the top). They
-- are commented out because each widens what a leaked outboxd credential can
-- do to the outbox: a role that only runs needs none of them. Each ends with
-- the commands it serves ("-- for: ..."); uncommented, that is a comment
-- still. The end-to-end tests grant exactly the lines of a command, from this
-- file, and run that command as the role.
--
-- The polling source (outboxd run --source=poll) reads and marks rows instead
-- of decoding WAL; it needs neither REPLICATION nor the publication, but:
--   GRANT SELECT, UPDATE (published_at) ON :"schema".:"table" TO :"role"; -- for: run --source=poll
--
-- run --retention / prune (add published_at with --source=poll):
--   GRANT SELECT (id, created_at), DELETE ON :"schema".:"table" TO :"role"; -- for: run --retention, prune
--
-- replay and audit (every column, since which ones they read depends on the
-- mapping; audit --repair republishes through replay's path):
--   GRANT SELECT ON :"schema".:"table" TO :"role"; -- for: replay, audit
--
-- checkpoint reset: the id column's sequence, whose name
-- SELECT pg_get_serial_sequence('schema.table', 'id') gives (outbox_id_seq
-- for the table of migration 001):
--   GRANT SELECT, UPDATE ON SEQUENCE :"schema".outbox_id_seq TO :"role"; -- for: checkpoint reset
--
-- status: no grant (it reads the catalogs, the slot's row and, with
-- --kafka-brokers, the checkpoint topic).
--
-- migrate: no grant; run it as the owner of the schema and the tables.
