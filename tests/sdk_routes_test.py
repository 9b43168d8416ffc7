#!/usr/bin/env python3
"""sdk_routes_test.py: what SDK 0.26 - 0.39 send and read beyond 0.25 (docs/protocol.md §3.1,
§3.5, §7.1, §7.5, §7.6, §12.4, §12.5), over real HTTP against `loom up`, each answer read the
way the SDK's types read it (tests/lib/sdk_types.py). Prints "N passed, N failed" last.

1. Optimizer families: create_model's optimizer_config (or optimizer) takes "adamw"; another
   family (Dimuon) is a 400 that names it, never a model trained as AdamW. optim_step reads
   its parameters under adam_params, optim_params or optimizer_params (the step runs with the
   learning rate sent under the alias, not a default); another family's parameters, two of
   the names at once or a non-string type are 400s; an operation that reaches the executor
   naming another family fails rather than running Adam.
2. Sessions: display_name, project_id and user_metadata (string values only, bounded) are
   kept and returned by GET sessions/{id} (GetSessionResponse and SessionSummary fields) and
   in GET sessions' session_summaries; create_model's user_metadata takes strings only too.
3. sessions/{id}/finish (ServiceClient.close): the first reason wins and is read back;
   heartbeats are 410 after it; the session refuses create_model, create_sampling_session, a
   model's submits and samples (400), while a future submitted before still resolves;
   another tenant cannot finish it (404); bad bodies are 400s naming the field.
4. Checkpoint user_metadata (save_weights, the named save_weights_for_sampler) and base_model
   in every Checkpoint; search_checkpoints with each filter, cursor paging over every match,
   owner own / accessible / user: another tenant's checkpoints appear only once published,
   and never with owner own; bad requests are 400s naming the field.
5. billing/usage/checkpoints/current: the tenant's live checkpoints per project with counts
   and bytes equal to the registry's, priced at --storage-usd-per-gb-month (0 by default);
   another tenant sees only its own.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import is_detail as detail, loom_cli, start_second_api  # noqa: E402
from sdk_types import (CHECKPOINT, CHECKPOINTS_LIST, CHECKPOINT_SEARCH_RESPONSE, GET_SESSION, LIST_SESSIONS,  # noqa: E402
                       SESSION_SUMMARY, STORAGE_USAGE, TRAINING_RUN, check)
from stack import Results, Stack  # noqa: E402
from trainer import ADAM, BASE, Trainer  # noqa: E402

R = Results()
PRICE = 0.25   # --storage-usd-per-gb-month of the stack


def reads_as(value, t, what):
    problems = check(value, t)
    if problems:
        print("      ", problems[:5])
    return R.check(not problems, what)


def get_json(url, path, key):
    import urllib.request
    req = urllib.request.Request(url + path, headers={"X-API-Key": key})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


def optimizers(s, alice):
    sid = alice.sid
    for field in ("optimizer_config", "optimizer"):
        R.check(detail(s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                                       field: {"type": "dimuon", "version": 1}}), 400,
                       f"{field}.type", "dimuon", "not offered"),
                f"create_model with {field} {{type: dimuon}}: 400 naming the family")
    R.check(detail(s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                                   "optimizer_config": {"type": 3}}), 400, "optimizer_config.type"),
            "create_model with a non-string optimizer_config.type: 400 naming it")
    R.check(detail(s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                                   "optimizer_config": {"type": "adamw"},
                                                   "optimizer": {"type": "dimuon"}}), 400, "send one"),
            "optimizer_config and optimizer naming different families: 400")
    R.check(int(s.psql("SELECT count(*) FROM models")) == 0, "no model was created by the refused requests")
    mid = alice.call("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": BASE,
                                              "lora_config": {"rank": 4, "seed": 3},
                                              "optimizer_config": {"type": "adamw"}})["model_id"]
    alice.nmodels, alice.seq[mid] = 1, 1
    R.check(s.psql(f"SELECT optimizer FROM models WHERE id = '{mid}'") == "adamw",
            "create_model with optimizer_config {type: adamw}: the model's family is adamw")
    alice.fb(mid, 0)
    # the alias carries the parameters: the step runs with this learning rate, not 1e-4
    for name, lr in (("optim_params", 3e-3), ("optimizer_params", 7e-3), ("adam_params", 2e-3)):
        params = dict(ADAM, learning_rate=lr)
        res = s.result(alice.submit(mid, "/api/v1/optim_step", {name: params}))
        R.check(res.get("type") == "optim_step" and abs(res["metrics"]["learning_rate:mean"] - lr) < 1e-12,
                f"optim_step with {name}: the step ran at learning rate {lr} ({res.get('metrics')})")
    payload = json.loads(s.psql(f"SELECT payload::text FROM operations WHERE model_id = '{mid}' AND kind = 'optim_step'"
                                " ORDER BY seq_id DESC LIMIT 1"))
    R.check(payload.get("optimizer") == "adamw" and payload["adam_params"]["learning_rate"] == 2e-3,
            f"the payload names the family for the executor: {payload}")
    seq = alice.seq[mid]
    R.check(detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq, "optimizer_params":
                                                 {"type": "dimuon", "learning_rate": 0.01, "beta1": 0.9}}),
                   400, "optimizer_params", "dimuon", "adamw"),
            "optim_step with Dimuon parameters on an AdamW model: 400 naming both families")
    R.check(detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM,
                                                 "optimizer_params": ADAM}), 400, "adam_params", "optimizer_params"),
            "optim_step with adam_params and optimizer_params both: 400 naming them")
    R.check(detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 2,
                                                 "optim_params": {"type": 1, "learning_rate": 0.1}}),
                   400, "optim_params.type"), "a non-string optim_params.type: 400 naming it")
    R.check(detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 3,
                                                 "optim_params": {"learning_rate": -1}}), 400,
                   "optim_params.learning_rate"), "range errors name the field the parameters came under")
    alice.seq[mid] = seq + 4   # the refused seq_ids are used up (recorded as failed operations)
    # an operation naming another family that reaches the executor (written past the api)
    seq = alice.seq[mid]
    alice.seq[mid] += 1
    s.psql("INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens)"
           f" SELECT 'req-dimuon-by-hand', tenant_id, id, {seq}, 'optim_step',"
           " '{\"optimizer\": \"dimuon\", \"adam_params\": {\"learning_rate\": 0.01, \"beta1\": 0.9, \"beta2\": 0.95,"
           " \"eps\": 1e-8, \"weight_decay\": 0, \"grad_clip_norm\": 0}}', 0"
           f" FROM models WHERE id = '{mid}'; NOTIFY loom_op_queued")
    res = s.result("req-dimuon-by-hand")
    R.check("dimuon" in str(res.get("error", "")) and res.get("category") == "server",
            f"the executor refuses a step naming another family: {res}")
    after = s.result(alice.submit(mid, "/api/v1/optim_step", {"adam_params": ADAM}))
    R.check(after.get("type") == "optim_step", "the model goes on with the next AdamW step")
    return mid


def sessions(s, alice, bob_key):
    st, cs = s.post("/api/v1/create_session", {"tags": ["x"], "sdk_version": "0.39.0", "project_id": "proj-a",
                                               "display_name": "nightly sft",
                                               "user_metadata": {"owner": "ml", "seed": "3"}})
    R.check(st == 200, f"create_session with display_name, project_id, user_metadata: {st}")
    sid = cs["session_id"]
    st, got = s.get(f"/api/v1/sessions/{sid}")
    reads_as(got, GET_SESSION, "GET sessions/{id} reads as GetSessionResponse")
    reads_as(got, SESSION_SUMMARY, "... and carries the SessionSummary fields")
    R.check(got.get("display_name") == "nightly sft" and got.get("project_id") == "proj-a" and
            got.get("user_metadata") == {"owner": "ml", "seed": "3"} and got.get("owner") == "default" and
            got.get("status") == {"type": "active"} and got.get("checkpoints_count") == 0,
            f"... with what was sent, owner, status active, no checkpoints: {got}")
    st, plain = s.get(f"/api/v1/sessions/{alice.sid}")
    R.check(plain.get("project_id") == "" and plain.get("display_name") is None and plain.get("user_metadata") is None,
            "a session that named none: project_id \"\" (a string in SessionSummary), display_name null")
    st, ls = s.get("/api/v1/sessions")
    reads_as(ls, LIST_SESSIONS, "GET sessions reads as ListSessionsResponse (ids)")
    sums = ls.get("session_summaries", [])
    R.check([x.get("session_id") for x in sums] == ls.get("sessions") and
            all(not check(x, SESSION_SUMMARY) for x in sums),
            f"... and session_summaries: one SessionSummary per id, in the same order ({len(sums)})")
    for body, words, what in (
            ({"user_metadata": {"seed": 3}}, ["user_metadata.seed", "string"], "an integer value"),
            ({"user_metadata": {"a": ["x"]}}, ["user_metadata.a", "string"], "a list value"),
            ({"user_metadata": "x"}, ["user_metadata", "object"], "a string for the map"),
            ({"user_metadata": {"k": "v" * 70000}}, ["user_metadata", "bytes"], "more than 64 KiB"),
            ({"display_name": "d" * 257}, ["display_name", "256"], "a display_name over 256 bytes"),
            ({"display_name": 5}, ["display_name", "string"], "a non-string display_name")):
        R.check(detail(s.post("/api/v1/create_session", body), 400, *words), f"create_session with {what}: 400")
    R.check(detail(s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                                   "user_metadata": {"lr": 0.1}}), 400, "user_metadata.lr"),
            "create_model with a non-string user_metadata value: 400 (TrainingRun reads dict[str, str])")
    R.check(s.get(f"/api/v1/sessions/{sid}", key=bob_key)[0] == 404, "another tenant's GET sessions/{id}: 404")
    return sid


def finish(s, bob_key):
    t = Trainer(s, s.key, display_name="to finish")
    mid = t.create()
    st, ss = s.post("/api/v1/create_sampling_session", {"session_id": t.sid, "base_model": BASE})
    sampler = ss["sampling_session_id"]
    pending = t.fb(mid, 1)   # submitted before the finish: still runs and resolves
    R.check(detail(s.post(f"/api/v1/sessions/{t.sid}/finish", {"reason": {"type": "success"}}, key=bob_key), 404,
                   "not found"), "another tenant finishing the session: 404")
    for body, words, what in (({}, ["reason is required"], "no reason"),
                              ({"reason": "success"}, ["reason", "object"], "a string reason"),
                              ({"reason": {"type": "done"}}, ["reason.type", "success"], "an unknown reason.type"),
                              ({"reason": {}}, ["reason.type is required"], "no reason.type"),
                              ({"reason": {"type": "success"}, "detail": "d" * 5000}, ["detail", "4096"],
                               "a detail over 4096 bytes")):
        R.check(detail(s.post(f"/api/v1/sessions/{t.sid}/finish", body), 400, *words), f"finish with {what}: 400")
    R.check(detail(s.post("/api/v1/sessions/no-such-session/finish", {"reason": {"type": "success"}}), 404),
            "finish of an unknown session: 404")
    R.check(s.post("/api/v1/session_heartbeat", {"session_id": t.sid})[0] == 200, "heartbeat before the finish: 200")
    st, first = s.post(f"/api/v1/sessions/{t.sid}/finish", {"reason": {"type": "interrupted"},
                                                            "detail": "KeyboardInterrupt"})
    R.check(st == 200 and first.get("reason") == "interrupted" and first.get("detail") == "KeyboardInterrupt" and
            first.get("status") == {"type": "client_finished", "reason": {"type": "interrupted"},
                                    "detail": "KeyboardInterrupt"} and first.get("finished_at"),
            f"finish: 200 with the reason, detail and time: {first}")
    st, second = s.post(f"/api/v1/sessions/{t.sid}/finish", {"reason": {"type": "success"}, "detail": "later"})
    R.check(st == 200 and second == first, "a second finish: the first reason wins, read back unchanged")
    R.check(s.psql(f"SELECT finish_reason || ' ' || finish_detail FROM sessions WHERE id = '{t.sid}'")
            == "interrupted KeyboardInterrupt", "the reason is kept in SQL")
    R.check(detail(s.post("/api/v1/session_heartbeat", {"session_id": t.sid}), 410, "finished"),
            "heartbeat after the finish: 410 (the SDK's heartbeat loop stops on it)")
    st, got = s.get(f"/api/v1/sessions/{t.sid}")
    R.check(st == 200 and got["status"] == first["status"] and got["training_run_ids"] == [mid],
            "the session stays readable, status client_finished, its run listed")
    R.check(detail(s.post("/api/v1/create_model", {"session_id": t.sid, "base_model": BASE}), 400,
                   "finished by its client", "interrupted"), "create_model in the finished session: 400")
    R.check(detail(s.post("/api/v1/create_sampling_session", {"session_id": t.sid, "base_model": BASE}), 400,
                   "finished by its client"), "create_sampling_session in it: 400")
    R.check(detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": t.seq[mid], "adam_params": ADAM}), 400,
                   "finished by its client"), "a submit for its model: 400")
    R.check(detail(s.post("/api/v1/asample", {"sampling_session_id": sampler, "seq_id": 0, "num_samples": 1,
                                              "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                                              "sampling_params": {"max_tokens": 2}}), 400, "finished by its client"),
            "a sample from its sampler: 400")
    res = s.result(pending)
    R.check("loss_fn_outputs" in res, "the forward_backward submitted before the finish resolved")
    other = Trainer(s, bob_key)
    R.check(s.post(f"/api/v1/sessions/{other.sid}/finish", {"reason": {"type": "success"}}, key=bob_key)[0] == 200 and
            s.psql(f"SELECT finish_reason IS NULL FROM sessions WHERE id = '{t.sid}'") == "f" and
            s.post("/api/v1/session_heartbeat", {"session_id": other.sid}, key=bob_key)[0] == 410,
            "bob finishes his own session (any key may, like the heartbeat)")


def checkpoints(s, alice, bob_key, mid):
    saved = alice.op(mid, "/api/v1/save_weights", {"path": "a1", "user_metadata": {"stage": "warm", "lr": "3e-3"}})
    a1 = saved["path"]
    a2 = alice.op(mid, "/api/v1/save_weights_for_sampler", {"path": "a2", "user_metadata": {"stage": "final"}})["path"]
    a3 = alice.op(mid, "/api/v1/save_weights", {"path": "a3"})["path"]
    for body, words, what in (({"path": "b1", "user_metadata": {"n": 1}}, ["user_metadata.n", "string"],
                               "a non-string value"),
                              ({"path": "b2", "user_metadata": {"k": "v" * 17000}}, ["user_metadata", "16384"],
                               "more than 16 KiB")):
        st, r = alice.post("/api/v1/save_weights", dict(body, model_id=mid, seq_id=alice.seq[mid]))
        alice.seq[mid] += 1
        R.check(detail((st, r), 400, *words), f"save_weights with user_metadata of {what}: 400")
    st, lst = s.get(f"/api/v1/training_runs/{mid}/checkpoints")
    reads_as(lst, CHECKPOINTS_LIST, "the run's checkpoints read as CheckpointsListResponse")
    by = {c["tinker_path"]: c for c in lst["checkpoints"]}
    R.check(by[a1]["user_metadata"] == {"stage": "warm", "lr": "3e-3"} and by[a2]["user_metadata"] == {"stage": "final"}
            and by[a3]["user_metadata"] is None and all(c["base_model"] == BASE for c in by.values()),
            "each Checkpoint returns its user_metadata (null when none) and base_model")
    shown = json.loads(loom_cli(s, "adapter", "show", a1))
    R.check(shown.get("user_metadata") == {"stage": "warm", "lr": "3e-3"}, "`loom adapter show` prints the user_metadata")
    st, one = s.get(f"/api/v1/training_runs/{mid}/checkpoints/sampler_weights/a2")
    reads_as(one, CHECKPOINT, "one checkpoint reads as Checkpoint")
    st, runs = s.get("/api/v1/training_runs")
    run = next(r for r in runs["training_runs"] if r["training_run_id"] == mid)
    reads_as(run, TRAINING_RUN, "the TrainingRun with its last checkpoints reads as TrainingRun")
    R.check(run["last_sampler_checkpoint"]["user_metadata"] == {"stage": "final"}, "... its last checkpoints too")
    st, sess = s.get(f"/api/v1/sessions/{alice.sid}")
    R.check(sess["checkpoints_count"] == 3 and sess["checkpoint_storage_bytes"] == sum(c["size_bytes"] for c in by.values()),
            f"the session counts its live checkpoints and their bytes ({sess['checkpoints_count']})")

    # ---- search -------------------------------------------------------------------------
    def search(body, key=None):
        st, r = s.post("/api/v1/checkpoints/search", body, **({"key": key} if key else {}))
        return st, r

    st, r = search({})
    reads_as(r, CHECKPOINT_SEARCH_RESPONSE, "search_checkpoints reads as CheckpointSearchResponse")
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [a3, a2, a1] and r["next_cursor"] is None,
            "search with no filter: the caller's checkpoints, newest first, no next page")
    for body, want, what in (
            ({"user_metadata": {"stage": "final"}}, [a2], "user_metadata"),
            ({"user_metadata": {"stage": "warm", "lr": "3e-3"}}, [a1], "two user_metadata pairs (both must hold)"),
            ({"user_metadata": {"stage": "warm", "lr": "1"}}, [], "a pair that does not hold"),
            ({"user_metadata": {}}, [a3, a2, a1], "an empty user_metadata (no filter)"),
            ({"checkpoint_type": "sampler"}, [a2], "checkpoint_type sampler"),
            ({"checkpoint_type": "training"}, [a3, a1], "checkpoint_type training"),
            ({"base_models": [BASE, "x/y"]}, [a3, a2, a1], "base_models"),
            ({"base_models": []}, [], "base_models [] (matches none)"),
            ({"project_ids": ["proj-a"]}, [], "a project of another session of the caller's"),
            ({"owner": {"type": "own"}, "checkpoint_type": None, "cursor": None}, [a3, a2, a1], "explicit nulls")):
        st, r = search(body)
        R.check(st == 200 and [c["tinker_path"] for c in r["checkpoints"]] == want,
                f"search by {what}: {[c['tinker_path'].rsplit('/', 1)[1] for c in r.get('checkpoints', [])]}")
    # paging: limit 1 walks all three with next_cursor, each once
    seen, body, pages = [], {"limit": 1}, 0
    while pages < 10:
        st, r = search(body)
        pages += 1
        seen += [c["tinker_path"] for c in r["checkpoints"]]
        if not r["next_cursor"]:
            break
        reads_as(r, CHECKPOINT_SEARCH_RESPONSE, f"page {pages} reads as CheckpointSearchResponse")
        body = {"limit": 1, "cursor": r["next_cursor"]}
    R.check(seen == [a3, a2, a1] and pages == 3, f"limit 1: three pages by next_cursor, each checkpoint once ({pages})")
    # another tenant: nothing of alice's with owner own, and with accessible only once published
    bob = Trainer(s, bob_key, project_id="bob-p")
    bmid = bob.create()
    b1 = bob.op(bmid, "/api/v1/save_weights_for_sampler", {"path": "b1", "user_metadata": {"stage": "final"}})["path"]
    st, r = search({"user_metadata": {"stage": "final"}}, key=bob_key)
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [b1], "bob's own search: his checkpoint only")
    st, r = search({"owner": {"type": "accessible"}, "user_metadata": {"stage": "final"}}, key=bob_key)
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [b1], "bob, owner accessible: alice's are private: not listed")
    st, r = search({"owner": {"type": "user", "owner_urns": ["default"]}}, key=bob_key)
    R.check(st == 200 and r["checkpoints"] == [], "bob, owner user default: nothing he may read")
    ckpt = a2.split("/", 3)[3]
    R.check(s.post(f"/api/v1/training_runs/{mid}/checkpoints/{ckpt}/publish")[0] == 200, "alice publishes a2")
    st, r = search({"owner": {"type": "accessible"}, "user_metadata": {"stage": "final"}}, key=bob_key)
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [b1, a2] and r["checkpoints"][1]["public"] is True,
            "bob, owner accessible: his own and alice's published one")
    st, r = search({"owner": {"type": "user", "owner_urns": ["default"]}}, key=bob_key)
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [a2], "bob, owner user default: alice's published one only")
    st, r = search({"project_ids": ["bob-p"]}, key=bob_key)
    R.check([c["tinker_path"] for c in r["checkpoints"]] == [b1], "bob, project_ids [his project]: his checkpoint")
    st, r = search({"owner": {"type": "own"}})
    R.check(b1 not in [c["tinker_path"] for c in r["checkpoints"]], "alice's own search never shows bob's")
    for body, words, what in (
            ({"limit": 0}, ["limit", "1 to 200"], "limit 0"), ({"limit": 201}, ["limit"], "limit 201"),
            ({"limit": "5"}, ["limit", "integer"], "a string limit"),
            ({"owner": {"type": "everyone"}}, ["owner.type"], "an unknown owner type"),
            ({"owner": {"type": "user"}}, ["owner.owner_urns"], "owner user without owner_urns"),
            ({"owner": {"type": "user", "owner_urns": [str(i) for i in range(11)]}}, ["owner.owner_urns", "11"],
             "eleven owner_urns"),
            ({"project_ids": ["bob-p"]}, ["project_ids[0]", "bob-p"], "another tenant's project"),
            ({"project_ids": [7]}, ["project_ids[0]"], "a non-string project id"),
            ({"base_models": "x"}, ["base_models", "array"], "a string for base_models"),
            ({"checkpoint_type": "weights"}, ["checkpoint_type"], "an unknown checkpoint_type"),
            ({"user_metadata": {"stage": 1}}, ["user_metadata.stage"], "a non-string user_metadata value"),
            ({"cursor": {"last_created_at": "yesterday", "last_checkpoint_uuid": "1"}}, ["cursor"], "a made-up cursor"),
            ({"cursor": {"last_created_at": "2026-02-31T00:00:00Z", "last_checkpoint_uuid": "5"}},
             ["cursor.last_created_at"], "a cursor time that is no date"),
            ({"cursor": {"last_created_at": "2026-02-01T00:00:00Z"}}, ["cursor.last_checkpoint_uuid"],
             "a cursor without its id")):
        R.check(detail(search(body), 400, *words), f"search with {what}: 400")
    return [a1, a2, a3], b1, bmid


def billing(s, bob_key, alice_paths):
    st, u = s.get("/api/v1/billing/usage/checkpoints/current")
    reads_as(u, STORAGE_USAGE, "billing/usage/checkpoints/current reads as CurrentCheckpointStorageUsageResponse")
    rows = u.get("data", [])
    live = s.psql("SELECT count(*) || ' ' || sum(v.size_bytes) FROM adapter_versions v JOIN adapters a"
                  " ON a.id = v.adapter_id JOIN tenants t ON t.id = a.tenant_id WHERE t.name = 'default'"
                  " AND v.deleted_at IS NULL").split()
    R.check(sum(r["checkpoint_count"] for r in rows) == int(live[0]) and
            sum(r["size_bytes"] for r in rows) == int(live[1]),
            f"counts and bytes are the registry's live checkpoints ({live})")
    R.check(u["effective_rate_usd_per_gigabyte_month"] == PRICE and
            all(abs(r["size_gigabytes"] - r["size_bytes"] / 1e9) < 1e-12 and
                abs(r["estimated_monthly_cost_usd"] - r["size_gigabytes"] * PRICE) < 1e-12 for r in rows),
            f"priced at --storage-usd-per-gb-month {PRICE} per decimal GB: {rows}")
    R.check([r["project_id"] for r in rows] == [None] and rows[0]["user_name"] == "default" and
            rows[0]["org_user_urn"] == "default", "alice's sessions named no project: one row, project null, owner named")
    st, b = s.get("/api/v1/billing/usage/checkpoints/current", key=bob_key)
    R.check(st == 200 and [(r["project_id"], r["checkpoint_count"], r["user_name"]) for r in b["data"]] ==
            [("bob-p", 1, "bob")], f"bob sees only his own checkpoint, under his project: {b['data']}")
    st, b = s.get("/api/v1/billing/usage/checkpoints/current?project_id=bob-p", key=bob_key)
    R.check(st == 200 and len(b["data"]) == 1, "?project_id= filters to that project")
    st, b = s.get("/api/v1/billing/usage/checkpoints/current?project_id=other", key=bob_key)
    R.check(st == 200 and b["data"] == [], "a project without checkpoints: no rows")
    R.check(detail(s.get("/api/v1/billing/usage/checkpoints/current?project_id="), 400, "project_id"),
            "an empty ?project_id=: 400")
    p, url = start_second_api(s)
    try:
        st, z = get_json(url, "/api/v1/billing/usage/checkpoints/current", s.key)
        R.check(z["effective_rate_usd_per_gigabyte_month"] == 0 and
                all(r["estimated_monthly_cost_usd"] == 0 for r in z["data"]),
                "without --storage-usd-per-gb-month the rate is 0")
    finally:
        p.kill()
        p.wait()


def main():
    with Stack(["--storage-usd-per-gb-month", str(PRICE)]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "bob")
        bob_key = loom_cli(s, "key", "create", "--tenant", "bob", "--secret-file", secret)
        alice = Trainer(s, s.key)
        mid = optimizers(s, alice)
        sessions(s, alice, bob_key)
        finish(s, bob_key)
        paths, b1, bmid = checkpoints(s, alice, bob_key, mid)
        billing(s, bob_key, paths)
    R.finish()


if __name__ == "__main__":
    main()
