-- 0031: every api keeps the keys it checked for a few seconds (core/api_auth.c), so that a
-- request costs no key lookup; a change that may refuse a key reaches every api at once,
-- whoever makes it (`loom key revoke`, SQL by hand): a NOTIFY on loom_api_keys empties
-- their caches. A key's revocation, expiry, scopes, hash or tenant; a key deleted; a
-- tenant renamed (the name a cached key answers with) or deleted (its keys go with it).
-- last_used_at, which the api itself writes once a minute per key, changes nothing.

CREATE FUNCTION loom_api_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('loom_api_keys', '');   -- one per transaction: PostgreSQL folds repeats
    RETURN NULL;
END $$;

CREATE TRIGGER api_keys_changed AFTER UPDATE ON api_keys FOR EACH ROW
    WHEN ((OLD.revoked_at, OLD.expires_at, OLD.scopes, OLD.hash, OLD.prefix, OLD.tenant_id)
          IS DISTINCT FROM (NEW.revoked_at, NEW.expires_at, NEW.scopes, NEW.hash, NEW.prefix, NEW.tenant_id))
    EXECUTE FUNCTION loom_api_keys_changed();
CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys FOR EACH STATEMENT
    EXECUTE FUNCTION loom_api_keys_changed();
CREATE TRIGGER tenants_changed AFTER UPDATE OF name OR DELETE ON tenants FOR EACH STATEMENT
    EXECUTE FUNCTION loom_api_keys_changed();
