-- 0028: the arrays of a forward / forward_backward travel packed, beside a JSON header.
--
-- payload_bin: what the executor reads of a forward / forward_backward (the loss and
-- every datum's tokens, targets, weights, sampler logprobs and advantages as
-- little-endian int32 / float32 arrays: contract/fb_payload.h); payload keeps a header for
-- SQL and people ({"loss_fn", "loss_fn_config", "datums"}).
-- result_bin: its result (metrics and every datum's logprobs and elementwise losses:
-- contract/fb_result.h), from which the api writes the JSON or protobuf answer; result
-- keeps a header ({"metrics", "loss_fn_output_type"}: operations.metrics, provenance).
-- Both are written and read as binary libpq values: a request's arrays are no longer
-- printed as JSON text and parsed again on their way to the backend (jsonb -> text ->
-- jansson in the executor), nor its outputs on their way back (jsonb -> text -> jansson ->
-- protobuf in the api). Other operations keep both NULL.
ALTER TABLE operations ADD COLUMN payload_bin bytea, ADD COLUMN result_bin bytea;

-- Rows written before move to the new form, so that nothing reads the old one again:
-- queued operations run after the upgrade, applied ones are replayed to rebuild a model
-- (and hashed into a checkpoint's data_digest), finished ones may still be fetched.
-- These functions write the formats of the C codecs in SQL (hex text, decoded once per
-- row); tests/test_fb_codec.c holds them to the codecs' own output.

-- A value's send form (big-endian) as little-endian hex.
CREATE FUNCTION pg_temp.le4(b bytea) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT substr(encode(b, 'hex'), 7, 2) || substr(encode(b, 'hex'), 5, 2) || substr(encode(b, 'hex'), 3, 2)
          || substr(encode(b, 'hex'), 1, 2) $$;
CREATE FUNCTION pg_temp.le8(b bytea) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT pg_temp.le4(substring(b FROM 5 FOR 4)) || pg_temp.le4(substring(b FROM 1 FOR 4)) $$;
CREATE FUNCTION pg_temp.u32(n integer) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT pg_temp.le4(int4send(n)) $$;

-- A JSON array of integers as int32, of numbers as float32 (parsed as the executor parsed
-- them: to a double, then rounded to a float).
CREATE FUNCTION pg_temp.i32s(a jsonb) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT coalesce(string_agg(pg_temp.le4(int4send(x::integer)), '' ORDER BY i), '')
     FROM jsonb_array_elements_text(a) WITH ORDINALITY t(x, i) $$;
CREATE FUNCTION pg_temp.f32s(a jsonb) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT coalesce(string_agg(pg_temp.le4(float4send(x::float8::float4)), '' ORDER BY i), '')
     FROM jsonb_array_elements_text(a) WITH ORDINALITY t(x, i) $$;

-- The loss_kind of contract.h.
CREATE FUNCTION pg_temp.loss_kind(name text) RETURNS integer LANGUAGE sql IMMUTABLE AS
$$ SELECT array_position(ARRAY['cross_entropy', 'importance_sampling', 'ppo', 'cispo', 'dro'], name) - 1 $$;

-- A datum of the old payload ({"tokens", "k"?, "target_tokens", "weights", "logprobs",
-- "advantages"}), the inputs the loss reads as the old executor read them.
CREATE FUNCTION pg_temp.datum(d jsonb, rl boolean) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT pg_temp.u32(jsonb_array_length(d->'tokens')) || pg_temp.u32(coalesce((d->>'k')::integer, 1))
          || pg_temp.u32(CASE WHEN t THEN 1 ELSE 0 END + CASE WHEN w THEN 2 ELSE 0 END
                         + CASE WHEN l THEN 4 ELSE 0 END + CASE WHEN a THEN 8 ELSE 0 END)
          || pg_temp.i32s(d->'tokens')
          || CASE WHEN t THEN pg_temp.i32s(d->'target_tokens') ELSE '' END
          || CASE WHEN w THEN pg_temp.f32s(d->'weights') ELSE '' END
          || CASE WHEN l THEN pg_temp.f32s(d->'logprobs') ELSE '' END
          || CASE WHEN a THEN pg_temp.f32s(d->'advantages') ELSE '' END
     FROM (SELECT jsonb_typeof(d->'target_tokens') = 'array' AS t,
                  NOT rl AND jsonb_typeof(d->'weights') = 'array' AS w,
                  rl AND jsonb_typeof(d->'logprobs') = 'array' AS l,
                  rl AND jsonb_typeof(d->'advantages') = 'array' AS a) x $$;

-- The whole payload: the loss with its config over the defaults (0.8, 1.2, 0.05; a key
-- only for the losses that read it), then the datums. NULL for an unknown loss: such an
-- operation then fails in the executor, as it did.
CREATE FUNCTION pg_temp.payload_bin(p jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT decode('4c464231' || pg_temp.u32(k)
          || pg_temp.le8(float8send(CASE WHEN k IN (2, 3) THEN coalesce((c->>'clip_low_threshold')::float8, 0.8) ELSE 0.8 END))
          || pg_temp.le8(float8send(CASE WHEN k IN (2, 3) THEN coalesce((c->>'clip_high_threshold')::float8, 1.2) ELSE 1.2 END))
          || pg_temp.le8(float8send(CASE WHEN k = 4 THEN coalesce((c->>'beta')::float8, 0.05) ELSE 0.05 END))
          || pg_temp.u32(jsonb_array_length(p->'data')) || '00000000'
          || (SELECT coalesce(string_agg(pg_temp.datum(d, k > 0), '' ORDER BY i), '')
                FROM jsonb_array_elements(p->'data') WITH ORDINALITY e(d, i)), 'hex')
     FROM (SELECT pg_temp.loss_kind(p->>'loss_fn') AS k, p->'loss_fn_config' AS c) x $$;

-- The old result ({"metrics", "loss_fn_outputs": [{"logprobs": {"data", "shape": [n] or
-- [n, k]}, "elementwise_loss": {"data"}}], "loss_fn_output_type"}) packed: metrics in
-- jsonb's key order, their values as stored (the 9 digits clients saw).
CREATE FUNCTION pg_temp.result_bin(r jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT decode('4c465231' || pg_temp.u32(jsonb_array_length(r->'loss_fn_outputs'))
          || pg_temp.u32((SELECT count(*)::integer FROM jsonb_object_keys(r->'metrics'))) || '00000000'
          || (SELECT coalesce(string_agg(encode(convert_to(k, 'UTF8'), 'hex') || repeat('00', 32 - octet_length(k))
                                         || pg_temp.le8(float8send(v::float8)),
                                         '' ORDER BY octet_length(k), convert_to(k, 'UTF8')), '')
                FROM jsonb_each_text(r->'metrics') m(k, v))
          || (SELECT coalesce(string_agg(pg_temp.u32((d->'logprobs'->'shape'->>0)::integer)
                                         || pg_temp.u32(coalesce((d->'logprobs'->'shape'->>1)::integer, 1))
                                         || pg_temp.f32s(d->'logprobs'->'data')
                                         || pg_temp.f32s(d->'elementwise_loss'->'data'), '' ORDER BY i), '')
                FROM jsonb_array_elements(r->'loss_fn_outputs') WITH ORDINALITY e(d, i)), 'hex') $$;

-- A payload these cannot read (written past the api) gets no packed form and fails when
-- it runs, as it would have; a result keeps its whole JSON, which the api then answers.
CREATE FUNCTION pg_temp.try_payload_bin(p jsonb) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN RETURN pg_temp.payload_bin(p); EXCEPTION WHEN others THEN RETURN NULL; END $$;
CREATE FUNCTION pg_temp.try_result_bin(r jsonb) RETURNS bytea LANGUAGE plpgsql AS
$$ BEGIN RETURN pg_temp.result_bin(r); EXCEPTION WHEN others THEN RETURN NULL; END $$;

UPDATE operations
   SET payload_bin = pg_temp.try_payload_bin(payload),
       payload = jsonb_build_object('loss_fn', payload->'loss_fn', 'loss_fn_config',
                                    coalesce(payload->'loss_fn_config', '{}'), 'datums',
                                    jsonb_array_length(payload->'data'))
 WHERE kind IN ('forward', 'forward_backward') AND jsonb_typeof(payload->'data') = 'array';

UPDATE operations
   SET (result_bin, result) = (SELECT b, CASE WHEN b IS NULL THEN result ELSE result - 'loss_fn_outputs' END
                                 FROM pg_temp.try_result_bin(result) b)
 WHERE kind IN ('forward', 'forward_backward') AND jsonb_typeof(result->'loss_fn_outputs') = 'array';
