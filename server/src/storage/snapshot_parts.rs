//! A snapshot stored in parts (`doc_snapshot_parts`, migrations 0008), the statements both
//! databases share: reading the parts of the generation `documents.snapshot_generation`
//! names, writing a part, and what the version-checked snapshot write does once its `UPDATE`
//! of the document row has matched (check or write the parts, drop every other generation,
//! drop the covered log rows).

use super::dialect::backend_impl;
use super::{snapshot_parts, DocId, SnapshotBytes, StorageError};

backend_impl!(
    impl<DB> SqlApi<DB> {
        /// The snapshot of `generation` (the document row's `snapshot_generation`), its parts put
        /// back together; `None` for a document without one.
        pub(super) async fn read_snapshot(
            conn: &mut DB::Connection,
            doc: DocId,
            generation: Option<i64>,
        ) -> Result<Option<Vec<u8>>, StorageError> {
            let Some(generation) = generation else {
                return Ok(None);
            };
            let parts: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT part, bytes FROM doc_snapshot_parts \
                 WHERE doc_id = $1 AND generation = $2 ORDER BY part",
            )
            .bind(doc)
            .bind(generation)
            .fetch_all(&mut *conn)
            .await?;
            if parts
                .iter()
                .enumerate()
                .any(|(i, (part, _))| *part != i as i64)
            {
                return Err(StorageError::Invalid(format!(
                    "document {doc}: a part of snapshot generation {generation} is missing"
                )));
            }
            if parts.len() == 1 {
                return Ok(parts.into_iter().next().map(|(_, bytes)| bytes));
            }
            let mut whole = Vec::with_capacity(parts.iter().map(|(_, b)| b.len()).sum());
            for (_, bytes) in parts {
                whole.extend_from_slice(&bytes);
            }
            Ok(Some(whole))
        }

        /// Writes one part of generation `generation`.
        pub(super) async fn insert_snapshot_part(
            conn: &mut DB::Connection,
            doc: DocId,
            generation: i64,
            part: i64,
            bytes: &[u8],
        ) -> Result<(), StorageError> {
            sqlx::query(
                "INSERT INTO doc_snapshot_parts (doc_id, generation, part, bytes) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(doc)
            .bind(generation)
            .bind(part)
            .bind(bytes)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        /// Checks that a staged snapshot's parts are all there (before its write changes
        /// anything).
        pub(super) async fn check_staged(
            conn: &mut DB::Connection,
            doc: DocId,
            snapshot: &SnapshotBytes,
        ) -> Result<(), StorageError> {
            let SnapshotBytes::Staged(staged) = snapshot else {
                return Ok(());
            };
            let (parts, len): (i64, Option<i64>) = sqlx::query_as(
                "SELECT COUNT(*), CAST(SUM(LENGTH(bytes)) AS BIGINT) FROM doc_snapshot_parts \
                 WHERE doc_id = $1 AND generation = $2",
            )
            .bind(doc)
            .bind(staged.generation)
            .fetch_one(&mut *conn)
            .await?;
            if parts != staged.parts || len.unwrap_or(0) != staged.len {
                return Err(StorageError::Invalid(format!(
                    "document {doc}: staged snapshot generation {} holds {parts} parts and {} \
                     bytes, not {} and {}",
                    staged.generation,
                    len.unwrap_or(0),
                    staged.parts,
                    staged.len
                )));
            }
            Ok(())
        }

        /// What a snapshot write does once its `UPDATE` of the document row (version and fence
        /// checked, `snapshot_generation` set to `generation`) has matched: writes a whole
        /// snapshot's parts, deletes every other generation of the document, and (with
        /// `delete_covered`) the log rows up to `upto_seq`.
        pub(super) async fn place_snapshot(
            conn: &mut DB::Connection,
            doc: DocId,
            generation: i64,
            snapshot: &SnapshotBytes,
            upto_seq: i64,
            delete_covered: bool,
        ) -> Result<(), StorageError> {
            if let SnapshotBytes::Whole(bytes) = snapshot {
                for (part, bytes) in snapshot_parts(bytes) {
                    Self::insert_snapshot_part(conn, doc, generation, part, &bytes).await?;
                }
            }
            sqlx::query("DELETE FROM doc_snapshot_parts WHERE doc_id = $1 AND generation <> $2")
                .bind(doc)
                .bind(generation)
                .execute(&mut *conn)
                .await?;
            if delete_covered {
                sqlx::query("DELETE FROM doc_updates WHERE doc_id = $1 AND seq <= $2")
                    .bind(doc)
                    .bind(upto_seq)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }
    }
);

impl SnapshotBytes {
    /// The generation the write makes the snapshot: the staged one, or a new one for parts
    /// written in the write's transaction.
    pub(super) fn generation(&self) -> i64 {
        match self {
            SnapshotBytes::Whole(_) => super::new_generation(),
            SnapshotBytes::Staged(staged) => staged.generation,
        }
    }
}
