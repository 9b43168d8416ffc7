-- The adapter registry: checkpoint paths that can be reused after a delete or an
-- overwrite, the op range behind each version, blob bookkeeping for GC, and two
-- views for operators (lineage, and which versions were trained on given data).

-- A tinker path is unique among live (not deleted) versions only: overwrite=true and
-- DELETE mark the old row deleted and keep it for lineage and audit.
ALTER TABLE adapter_versions DROP CONSTRAINT adapter_versions_tinker_path_key;
CREATE UNIQUE INDEX adapter_versions_live_path ON adapter_versions (tinker_path)
    WHERE deleted_at IS NULL;
CREATE INDEX adapter_versions_adapter ON adapter_versions (adapter_id, id);
CREATE INDEX adapter_versions_expiry ON adapter_versions (expires_at)
    WHERE deleted_at IS NULL AND expires_at IS NOT NULL;
CREATE INDEX adapter_versions_data_digest ON adapter_versions ((provenance->>'data_digest'));

-- seq_id: the save operation's seq_id in its model (NULL for imports); the provenance
-- op range of the next version starts after it. blob_removed_at: set by GC once the
-- blob of a deleted or expired version is gone from the store.
ALTER TABLE adapter_versions ADD COLUMN seq_id integer;
ALTER TABLE adapter_versions ADD COLUMN blob_removed_at timestamptz;

CREATE INDEX adapter_grants_tenant ON adapter_grants (tenant_id);

-- Every version with its adapter, its parent's path and its whole ancestor chain
-- (nearest first; the chain may cross adapters when a model started from load_weights).
CREATE VIEW adapter_history AS
WITH RECURSIVE chain (version_id, ancestor_id, depth) AS (
    SELECT id, parent_id, 1 FROM adapter_versions WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT c.version_id, p.parent_id, c.depth + 1
    FROM chain c JOIN adapter_versions p ON p.id = c.ancestor_id
    WHERE p.parent_id IS NOT NULL AND c.depth < 10000
)
SELECT a.tenant_id, a.id AS adapter_id, a.name AS adapter_name, a.model_id,
       v.id AS version_id, v.kind, v.name, v.tinker_path, v.step, v.seq_id,
       v.parent_id, p.tinker_path AS parent_path,
       COALESCE((SELECT array_agg(c.ancestor_id ORDER BY c.depth) FROM chain c
                 WHERE c.version_id = v.id), '{}') AS ancestors,
       v.blob_digest, v.size_bytes, v.visibility, v.created_at, v.expires_at, v.deleted_at,
       v.provenance
FROM adapter_versions v
JOIN adapters a ON a.id = v.adapter_id
LEFT JOIN adapter_versions p ON p.id = v.parent_id;

-- Which versions were trained on a given token stream: provenance.data_digest is the
-- sha256 of the forward_backward data consumed since the parent version.
CREATE VIEW adapter_versions_by_data_digest AS
SELECT v.provenance->>'data_digest' AS data_digest, a.tenant_id, a.name AS adapter_name,
       v.id AS version_id, v.tinker_path, v.kind, v.step,
       (v.provenance->>'seq_from')::integer AS seq_from,
       (v.provenance->>'seq_to')::integer AS seq_to,
       (v.provenance->>'tokens')::bigint AS tokens,
       v.created_at, v.deleted_at
FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id
WHERE v.provenance ? 'data_digest';
