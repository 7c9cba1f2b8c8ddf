//! What differs between the two databases, in one place. Everything else in storage is written
//! once, generic over [`Dialect`] (see `sql_api.rs` and `sql_docs.rs`): the statements are the
//! same text on both (`$n` placeholders, which SQLite accepts too; `CAST` where PostgreSQL
//! needs a parameter's type), so only these few items are spelled twice.
//!
//! Why generic code and not sqlx's `Any` driver: `Any` copies every row into its own value
//! type, loses the SQLite connect options we set (WAL, synchronous, busy timeout) and the
//! PostgreSQL array binds the append path uses. Why not a table of query strings per dialect:
//! the statements are the same, so a table would hold every one twice.

use async_trait::async_trait;
use sqlx::{Database, Pool, Postgres, Sqlite};

use super::StorageError;

/// One database's answers to the questions where SQLite and PostgreSQL differ.
#[async_trait]
pub trait Dialect: Database {
    /// Opens a read transaction whose statements all see one committed state (a snapshot
    /// committed between two of them would otherwise delete log rows the first still needs).
    const BEGIN_READ_SNAPSHOT: &'static str;

    /// Ends a `SELECT` that picks rows to claim: rows another transaction is claiming are
    /// passed over instead of waited for.
    const SKIP_LOCKED: &'static str;

    /// Ends a `SELECT` that locks the rows it picks for an update (in its `ORDER BY` order,
    /// so two statements locking several rows never deadlock).
    const LOCK_ROWS: &'static str;

    /// The database's clock in milliseconds since the Unix epoch, as a SQL expression: lease
    /// times come from it, the one clock every node sharing the database agrees on.
    const NOW_MS: &'static str;

    /// A statement giving the bytes the database takes.
    const STORE_SIZE: &'static str;

    /// Makes rows inserted into `table` by this transaction take their ids only after every
    /// earlier insert has committed, so that readers applying "the rows after the last id I
    /// have seen" never skip one. Run first in the inserting transaction.
    async fn order_ids(
        tx: &mut sqlx::Transaction<'_, Self>,
        table: &'static str,
    ) -> Result<(), StorageError>;

    /// Rows a statement changed (an inherent method on each database's result type).
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// Moves outbox event `id` to the dead-letter table if it still has `revision` (a fold
    /// may have changed it meanwhile: then nothing moves). True if it moved.
    async fn move_to_dead(
        pool: &Pool<Self>,
        id: i64,
        revision: i64,
        error: &str,
        now: i64,
    ) -> Result<bool, StorageError>;
}

#[async_trait]
impl Dialect for Sqlite {
    // SQLite's read transaction keeps the snapshot of its first read (WAL mode).
    const BEGIN_READ_SNAPSHOT: &'static str = "BEGIN";
    // One writer at a time: nothing to pass over, nothing to lock.
    const SKIP_LOCKED: &'static str = "";
    const LOCK_ROWS: &'static str = "";
    const NOW_MS: &'static str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    const STORE_SIZE: &'static str =
        "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()";

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    async fn order_ids(
        _tx: &mut sqlx::Transaction<'_, Self>,
        _table: &'static str,
    ) -> Result<(), StorageError> {
        // One writer at a time (the database lock): ids commit in the order they are taken.
        Ok(())
    }

    async fn move_to_dead(
        pool: &Pool<Self>,
        id: i64,
        revision: i64,
        error: &str,
        now: i64,
    ) -> Result<bool, StorageError> {
        // No DELETE inside a WITH here; the transaction holds the write lock from the INSERT
        // on, so no fold can come between the two statements.
        let mut tx = pool.begin().await?;
        let moved = sqlx::query(
            "INSERT INTO outbox_dead \
               (id, event_id, type, payload, attempts, last_error, created_at, died_at) \
             SELECT id, event_id, type, payload, attempts + 1, $1, created_at, $2 FROM outbox \
             WHERE id = $3 AND revision = $4",
        )
        .bind(error)
        .bind(now)
        .bind(id)
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        let moved = moved.rows_affected() == 1;
        if moved {
            sqlx::query("DELETE FROM outbox WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(moved)
    }
}

#[async_trait]
impl Dialect for Postgres {
    // READ COMMITTED would take a new snapshot for every statement.
    const BEGIN_READ_SNAPSHOT: &'static str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
    const SKIP_LOCKED: &'static str = "FOR UPDATE SKIP LOCKED";
    const LOCK_ROWS: &'static str = "FOR NO KEY UPDATE";
    const NOW_MS: &'static str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
    const STORE_SIZE: &'static str = "SELECT pg_database_size(current_database())";

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    async fn order_ids(
        tx: &mut sqlx::Transaction<'_, Self>,
        table: &'static str,
    ) -> Result<(), StorageError> {
        // Two concurrent inserts could commit out of id order. This lock conflicts with itself,
        // not with readers: the next insert takes its id only once this transaction commits.
        sqlx::query(&format!("LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn move_to_dead(
        pool: &Pool<Self>,
        id: i64,
        revision: i64,
        error: &str,
        now: i64,
    ) -> Result<bool, StorageError> {
        // One statement: the DELETE locks the row and re-checks the revision if a fold changed
        // it meanwhile (then nothing moves), so a fold can never be deleted unseen.
        let moved = sqlx::query(
            "WITH moved AS ( \
               DELETE FROM outbox WHERE id = $1 AND revision = $2 \
               RETURNING id, event_id, type, payload, attempts, created_at \
             ) \
             INSERT INTO outbox_dead \
               (id, event_id, type, payload, attempts, last_error, created_at, died_at) \
             SELECT id, event_id, type, payload, attempts + 1, $3, created_at, $4 FROM moved",
        )
        .bind(id)
        .bind(revision)
        .bind(error)
        .bind(now)
        .execute(pool)
        .await?;
        Ok(moved.rows_affected() == 1)
    }
}

/// Writes an `impl` block generic over the database `DB` (`impl<DB> SqlApi<DB> { .. }` or
/// `impl<DB> SomeTrait for SqlApi<DB> { .. }`, attributes such as `#[async_trait]` kept) with
/// the bounds sqlx needs to run the shared statements on `DB`: its connections execute them,
/// and the column and parameter types they use encode and decode. Both [`Sqlite`] and
/// [`Postgres`] meet them.
///
/// A macro rather than a `Backend` trait with these bounds and a blanket impl: Rust takes only
/// a trait's `Self: ...` bounds as given where the trait is used, not where clauses on other
/// types such as `i64: Encode<'a, Self>` (rust-lang/rust#20671), so every `impl<DB: Backend>`
/// would have had to repeat them.
macro_rules! backend_impl {
    ($(#[$attr:meta])* impl<DB> SqlApi<DB> { $($body:tt)* }) => {
        $crate::storage::dialect::backend_impl! {
            @bounded [$(#[$attr])*] [] { $($body)* }
        }
    };
    ($(#[$attr:meta])* impl<DB> $trait:ident for SqlApi<DB> { $($body:tt)* }) => {
        $crate::storage::dialect::backend_impl! {
            @bounded [$(#[$attr])*] [$trait for] { $($body)* }
        }
    };
    (@bounded [$($attr:tt)*] [$($trait:tt)*] { $($body:tt)* }) => {
        $($attr)*
        impl<DB> $($trait)* $crate::storage::sql_api::SqlApi<DB>
        where
            DB: $crate::storage::dialect::Dialect,
            for<'c> &'c mut DB::Connection: ::sqlx::Executor<'c, Database = DB>,
            for<'q> DB::Arguments<'q>: ::sqlx::IntoArguments<'q, DB>,
            for<'a> &'a str: ::sqlx::ColumnIndex<DB::Row> + ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            usize: ::sqlx::ColumnIndex<DB::Row>,
            for<'a> i64: ::sqlx::Encode<'a, DB> + ::sqlx::Decode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> String: ::sqlx::Encode<'a, DB> + ::sqlx::Decode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> Vec<u8>: ::sqlx::Encode<'a, DB> + ::sqlx::Decode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> &'a [u8]: ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> bool: ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> Option<&'a str>: ::sqlx::Encode<'a, DB>,
            for<'a> Option<String>: ::sqlx::Encode<'a, DB> + ::sqlx::Decode<'a, DB>,
            for<'a> Option<i64>: ::sqlx::Encode<'a, DB> + ::sqlx::Decode<'a, DB>,
            for<'a> Option<Vec<u8>>: ::sqlx::Decode<'a, DB>,
        {
            $($body)*
        }
    };
}
pub(super) use backend_impl;

/// The batch again, each request in a savepoint of one transaction, so that only a failing
/// request fails: what both writers fall back to when a batch's fast path fails. Evaluates to
/// `Ok(results)`, one per request; `?` passes a failure of the transaction itself on. A macro
/// because each backend's transaction and request types differ and a closure returning a
/// future that borrows the savepoint cannot be written for both.
macro_rules! each_in_a_savepoint {
    ($conn:expr, $batch:expr, |$sp:ident, $req:ident| $apply:expr) => {{
        let mut results = Vec::with_capacity($batch.len());
        let mut tx = ::sqlx::Connection::begin(&mut *$conn).await?;
        for $req in $batch {
            let mut $sp = ::sqlx::Connection::begin(&mut *tx).await?;
            let result = $apply.await;
            if result.is_ok() {
                $sp.commit().await?;
            } else {
                $sp.rollback().await?;
            }
            results.push(result);
        }
        tx.commit().await?;
        Ok(results)
    }};
}
pub(super) use each_in_a_savepoint;
