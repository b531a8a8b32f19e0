/**
 * django-outbox browser client: a plain ES module (no build step, no dependencies).
 *
 *   <script type="module">
 *     import { createOutbox } from "/static/django_outbox/outbox.js";
 *     const outbox = createOutbox({ baseURL: "/outbox/", storageKey: "outbox:" + userID });
 *     outbox.send("ws1", "ses_1", "Fix the flaky test");          // survives reloads
 *     const sub = outbox.subscribe("ws1", "ses_1", (view) => render(view));
 *     sub.retry(entryID); sub.dismiss(entryID); sub.close();
 *   </script>
 *
 * send() is the client's half of "a disconnect never loses a message": it gives the
 * prompt a clientMessageID (crypto.randomUUID), writes it to localStorage *before* the
 * first POST, and re-POSTs it with the same key, with backoff, until the server answers
 * 202 (accepted) or 200 (accepted earlier: a duplicate of our own resend). 408, 429, 5xx
 * and network errors are retried (Retry-After is honoured); any other 4xx is final: the
 * prompt is dropped and reported. Unacknowledged prompts are resumed when the page
 * loads again, comes back online or becomes visible. Prompts of one session are sent
 * one at a time, oldest first, so a retry never lets a later prompt overtake it.
 *
 * subscribe() opens the queue WebSocket (ws/outbox/workspaces/<ws>/sessions/<ses>/),
 * applies the snapshot and then each queue.update by version: older versions are
 * ignored; on a gap (version > current + 1) the update is held for `gapWait` ms, since
 * events published by different processes (the web process's "queued", the worker's
 * "delivering") can arrive out of order; if the missing versions do not turn up by
 * then it sends {"type": "resync"} and applies the fresh snapshot. Updates whose version
 * equals the current one are applied too: one mutation that changes several entries (a
 * recovery, park/unpark) publishes one event per entry with the same version, and
 * re-applying a state is harmless. The socket reconnects with backoff (not after close
 * codes 4400 invalid / 4403 forbidden).
 */

const PENDING_SUFFIX = ":pending";
const FINAL_CLOSE_CODES = new Set([4400, 4403, 1003, 1009]);

/** A final refusal of a send, or a failed retry/dismiss: HTTP status, code and detail. */
export class OutboxError extends Error {
  constructor(status, code, detail) {
    super(detail || code || `HTTP ${status}`);
    this.name = "OutboxError";
    this.status = status;
    this.code = code || "";
    this.detail = detail || "";
  }
}

function readCookie(name) {
  const prefix = name + "=";
  for (const part of (globalThis.document?.cookie || "").split(";")) {
    const item = part.trim();
    if (item.startsWith(prefix)) return decodeURIComponent(item.slice(prefix.length));
  }
  return "";
}

function randomID() {
  if (globalThis.crypto?.randomUUID) return globalThis.crypto.randomUUID();
  // Older browsers on plain http: 122 random bits in UUID form.
  const b = globalThis.crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function backoffDelay(attempt, { initial, max }) {
  const base = Math.min(max, initial * 2 ** Math.max(0, attempt - 1));
  return Math.round(base * (0.5 + Math.random() * 0.5)); // jitter: no thundering herd
}

function pairKey(workspace, session) {
  return `${workspace}\u0000${session}`;
}

/** The display state of a snapshot entry: queued (never tried) or pending (backing off). */
function stateOf(entry) {
  if (entry.status !== "pending") return entry.status;
  const tried = entry.attempts || entry.transientFails || entry.nextAttemptAt;
  return tried ? "pending" : "queued";
}

/**
 * Make a client. Options (all optional):
 *   baseURL       where django_outbox.urls is mounted (default "/outbox/")
 *   wsURL         origin of the WebSocket routes (default: this page's, ws: or wss:)
 *   csrfToken     a string or a function returning one (default: the csrftoken cookie)
 *   csrfHeader    default "X-CSRFToken"
 *   storageKey    localStorage key; include the user's ID so that two people sharing a
 *                 browser never resend each other's prompts (default "django-outbox")
 *   requestTimeout  ms before a POST is abandoned and retried (default 15000)
 *   backoff       {initial, max} in ms for resends (default 1000, 30000)
 *   reconnect     {initial, max} in ms for the WebSocket (default 500, 15000)
 *   gapWait       ms an out-of-order update waits for the versions before it (default 500)
 *   keepFinished  how many sent/dismissed entries a view keeps showing (default 50)
 *   onEvent       (event) => void for sends: {type: "accepted"|"duplicate"|"retrying"|
 *                 "rejected", item, status?, id?, error?, retryIn?}
 *   storage, fetch, WebSocket   injectables (tests)
 */
export function createOutbox(options = {}) {
  const opts = {
    baseURL: "/outbox/",
    wsURL: null,
    csrfToken: null,
    csrfHeader: "X-CSRFToken",
    storageKey: "django-outbox",
    requestTimeout: 15000,
    backoff: { initial: 1000, max: 30000 },
    reconnect: { initial: 500, max: 15000 },
    gapWait: 500,
    keepFinished: 50,
    onEvent: null,
    storage: globalThis.localStorage,
    fetch: globalThis.fetch?.bind(globalThis),
    WebSocket: globalThis.WebSocket,
    ...options,
  };
  const base = opts.baseURL.endsWith("/") ? opts.baseURL : opts.baseURL + "/";
  const storeKey = opts.storageKey + PENDING_SUFFIX;
  const inFlight = new Set(); // pair keys with a POST on the wire
  const waiters = new Map(); // clientMessageID -> {resolve, reject}
  const subscriptions = new Set();
  const listeners = new Set(opts.onEvent ? [opts.onEvent] : []);
  let timer = null;
  let closed = false;

  const csrf = () =>
    typeof opts.csrfToken === "function"
      ? opts.csrfToken()
      : opts.csrfToken || readCookie("csrftoken");

  const messagesURL = (workspace, session) =>
    `${base}api/workspaces/${encodeURIComponent(workspace)}/sessions/` +
    `${encodeURIComponent(session)}/messages/`;

  // -- the localStorage queue ------------------------------------------------------

  function load() {
    try {
      const items = JSON.parse(opts.storage?.getItem(storeKey) || "[]");
      return Array.isArray(items) ? items : [];
    } catch {
      return [];
    }
  }

  function save(items) {
    try {
      if (items.length) opts.storage?.setItem(storeKey, JSON.stringify(items));
      else opts.storage?.removeItem(storeKey);
    } catch (err) {
      // Quota exceeded or storage disabled: the send still runs, it just won't survive
      // a reload. Say so rather than fail.
      emit({ type: "storage-error", error: String(err) });
    }
  }

  function update(clientMessageID, change) {
    const items = load();
    const i = items.findIndex((x) => x.clientMessageID === clientMessageID);
    if (i < 0) return null;
    const item = items[i];
    if (change === null) items.splice(i, 1);
    else Object.assign(item, change);
    save(items);
    return item;
  }

  function emit(event) {
    for (const fn of listeners) {
      try {
        fn(event);
      } catch (err) {
        console.error("outbox: listener failed", err);
      }
    }
    for (const sub of subscriptions) sub._localChanged(event);
  }

  // -- sending -------------------------------------------------------------------------

  function send(workspace, session, text, sendOptions = {}) {
    const item = {
      workspace,
      session,
      text,
      clientMessageID: sendOptions.clientMessageID || randomID(),
      createdAt: Date.now(),
      attempts: 0,
      nextAt: 0,
      lastError: "",
    };
    if (sendOptions.model !== undefined) item.model = sendOptions.model;
    const items = load();
    items.push(item);
    save(items); // durable before the first byte goes out
    const done = new Promise((resolve, reject) => {
      waiters.set(item.clientMessageID, { resolve, reject });
    });
    emit({ type: "queued", item });
    pump();
    return done;
  }

  /** Schedule the next POST of each session's oldest unacknowledged prompt. */
  function pump() {
    if (closed) return;
    clearTimeout(timer);
    timer = null;
    const now = Date.now();
    const heads = new Map();
    for (const item of load()) {
      const key = pairKey(item.workspace, item.session);
      if (!heads.has(key)) heads.set(key, item);
    }
    let wake = Infinity;
    for (const [key, item] of heads) {
      if (inFlight.has(key)) continue;
      if (item.nextAt > now) {
        wake = Math.min(wake, item.nextAt);
        continue;
      }
      post(key, item);
    }
    if (wake !== Infinity) timer = setTimeout(pump, Math.max(0, wake - Date.now()));
  }

  async function post(key, item) {
    inFlight.add(key);
    const body = { clientMessageID: item.clientMessageID, text: item.text };
    if (item.model !== undefined) body.model = item.model;
    const controller = new AbortController();
    const abort = setTimeout(() => controller.abort(), opts.requestTimeout);
    let status = 0;
    let data = null;
    let retryAfter = 0;
    let error = "";
    update(item.clientMessageID, { sending: true });
    try {
      const response = await opts.fetch(messagesURL(item.workspace, item.session), {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          Accept: "application/json",
          [opts.csrfHeader]: csrf(),
        },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      status = response.status;
      retryAfter = Number(response.headers.get("Retry-After")) || 0;
      data = await response.json().catch(() => null);
    } catch (err) {
      error = err?.name === "AbortError" ? "request timed out" : String(err?.message || err);
    } finally {
      clearTimeout(abort);
      inFlight.delete(key);
    }
    const waiter = waiters.get(item.clientMessageID);
    if (status === 202 || status === 200) {
      update(item.clientMessageID, null);
      waiters.delete(item.clientMessageID);
      const id = data?.id;
      const type = status === 202 ? "accepted" : "duplicate";
      if (status === 202 && data) adopt(item, data);
      emit({ type, item, status, id, entry: status === 202 ? data : null });
      waiter?.resolve({ status: type, id, entry: status === 202 ? data : null });
    } else if (status && status < 500 && status !== 408 && status !== 429) {
      update(item.clientMessageID, null);
      waiters.delete(item.clientMessageID);
      const err = new OutboxError(status, data?.code, data?.detail);
      emit({ type: "rejected", item, status, error: err });
      waiter?.reject(err);
    } else {
      const attempts = (item.attempts || 0) + 1;
      let delay = backoffDelay(attempts, opts.backoff);
      if (retryAfter) delay = Math.max(delay, Math.min(retryAfter * 1000, 5 * opts.backoff.max));
      const lastError = error || `HTTP ${status}${data?.code ? " " + data.code : ""}`;
      const changed = update(item.clientMessageID, {
        attempts,
        nextAt: Date.now() + delay,
        lastError,
        sending: false,
      });
      if (changed) emit({ type: "retrying", item: changed, status, error: lastError, retryIn: delay });
    }
    pump();
  }

  /** Hand a 202's entry to the views of its session (the WebSocket may be slower). */
  function adopt(item, entry) {
    for (const sub of subscriptions) {
      if (sub.workspace === item.workspace && sub.session === item.session) sub._adopt(entry);
    }
  }

  /** The prompts of a session (or all) not yet acknowledged by the server. */
  function pending(workspace, session) {
    return load().filter(
      (x) => workspace === undefined || (x.workspace === workspace && x.session === session),
    );
  }

  /** Stop resending a prompt that was never acknowledged (a POST on the wire may still land). */
  function cancel(clientMessageID) {
    const removed = update(clientMessageID, null);
    const waiter = waiters.get(clientMessageID);
    waiters.delete(clientMessageID);
    waiter?.reject(new OutboxError(0, "cancelled", "cancelled before it was acknowledged"));
    emit({ type: "cancelled", item: removed || { clientMessageID } });
    pump();
  }

  // -- retry / dismiss -------------------------------------------------------------------

  async function call(method, url) {
    const response = await opts.fetch(url, {
      method,
      credentials: "same-origin",
      headers: { Accept: "application/json", [opts.csrfHeader]: csrf() },
    });
    const data = response.status === 204 ? null : await response.json().catch(() => null);
    if (!response.ok) throw new OutboxError(response.status, data?.code, data?.detail);
    return data;
  }

  /** Re-arm an entry (error → pending, or skip its backoff). 404/409 throw OutboxError. */
  function retry(workspace, session, id) {
    return call("POST", `${messagesURL(workspace, session)}${encodeURIComponent(id)}/retry/`);
  }

  /** Remove an entry from the queue. 404/409 (busy: being delivered) throw OutboxError. */
  function dismiss(workspace, session, id) {
    return call("DELETE", `${messagesURL(workspace, session)}${encodeURIComponent(id)}/`);
  }

  // -- watching ------------------------------------------------------------------------

  function subscribe(workspace, session, onChange) {
    const sub = new Subscription(workspace, session, onChange, {
      opts,
      pending: () => pending(workspace, session),
      retry: (id) => retry(workspace, session, id),
      dismiss: (id) => dismiss(workspace, session, id),
      forget: () => subscriptions.delete(sub),
    });
    subscriptions.add(sub);
    sub._open();
    return sub;
  }

  // -- waking up -------------------------------------------------------------------------

  const onOnline = () => {
    // Back online: resend now instead of waiting out the backoff.
    save(load().map((x) => ({ ...x, nextAt: 0 })));
    pump();
  };
  const onVisible = () => {
    if (globalThis.document?.visibilityState !== "visible") return;
    pump();
    for (const sub of subscriptions) sub._wake();
  };
  const onStorage = (event) => {
    if (event.key !== storeKey) return;
    for (const sub of subscriptions) sub._localChanged({ type: "storage" });
    pump();
  };
  globalThis.addEventListener?.("online", onOnline);
  globalThis.addEventListener?.("storage", onStorage);
  globalThis.document?.addEventListener?.("visibilitychange", onVisible);

  function close() {
    closed = true;
    clearTimeout(timer);
    for (const sub of [...subscriptions]) sub.close();
    globalThis.removeEventListener?.("online", onOnline);
    globalThis.removeEventListener?.("storage", onStorage);
    globalThis.document?.removeEventListener?.("visibilitychange", onVisible);
  }

  // Resume what an earlier page left unacknowledged.
  for (const item of load()) if (item.sending) update(item.clientMessageID, { sending: false });
  pump();

  return {
    send,
    subscribe,
    retry,
    dismiss,
    pending,
    cancel,
    close,
    resume: pump,
    on(fn) {
      listeners.add(fn);
      return () => listeners.delete(fn);
    },
  };
}

/**
 * One session's live queue. onChange(view) is called after every change with
 *   {workspace, session, connected, version, error,
 *    entries: [{id, clientMessageID, text, state, entry, blockedByInFlight, inFlightSince}],
 *    pending: [{clientMessageID, text, attempts, nextAt, lastError, sending}]}
 * entries are the server's (FIFO by acceptedAt), finished ones (state "sent",
 * "dismissed" or "finished" when it ended while we were disconnected) included;
 * pending are this browser's prompts not yet acknowledged. inFlightSince is a
 * Date.now()-style time: show "blocked behind an in-flight message for N s".
 */
class Subscription {
  constructor(workspace, session, onChange, ctx) {
    this.workspace = workspace;
    this.session = session;
    this.onChange = onChange;
    this.ctx = ctx;
    this.opts = ctx.opts;
    this.version = null;
    this.entries = new Map(); // id -> row (live queue)
    this.finished = new Map(); // id -> row (sent / dismissed), newest last
    this.leaseSince = null; // when the current in-flight delivery started (local clock)
    this.connected = false;
    this.error = null;
    this.ws = null;
    this.attempt = 0;
    this.reconnectTimer = null;
    this.resyncAsked = false;
    this.held = []; // updates that arrived ahead of a missing version
    this.gapTimer = null;
    this.closed = false;
  }

  retry(id) {
    return this.ctx.retry(id);
  }

  dismiss(id) {
    return this.ctx.dismiss(id);
  }

  /** Ask the server for a fresh snapshot (also done automatically on a version gap). */
  resync() {
    if (this.ws?.readyState === 1) {
      this.resyncAsked = true;
      this.ws.send(JSON.stringify({ type: "resync" }));
    }
  }

  close() {
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.gapTimer);
    this.ctx.forget();
    if (this.ws) this.ws.close(1000);
  }

  _url() {
    let origin = this.opts.wsURL;
    if (!origin) {
      const loc = globalThis.location;
      origin = `${loc.protocol === "https:" ? "wss:" : "ws:"}//${loc.host}/`;
    }
    if (!origin.endsWith("/")) origin += "/";
    return (
      `${origin}ws/outbox/workspaces/${encodeURIComponent(this.workspace)}` +
      `/sessions/${encodeURIComponent(this.session)}/`
    );
  }

  _open() {
    if (this.closed) return;
    const ws = new this.opts.WebSocket(this._url());
    this.ws = ws;
    ws.onmessage = (event) => this._frame(event.data);
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.connected = false;
      this.resyncAsked = false;
      this.held = [];
      clearTimeout(this.gapTimer);
      this.gapTimer = null;
      if (this.closed) return;
      if (FINAL_CLOSE_CODES.has(event.code)) {
        this.error = {
          code: event.code === 4403 ? "forbidden" : "refused",
          detail: `the server closed the queue socket (${event.code})`,
        };
        this._render();
        return;
      }
      this.attempt += 1;
      const delay = backoffDelay(this.attempt, this.opts.reconnect);
      this._render();
      this.reconnectTimer = setTimeout(() => this._open(), delay);
    };
  }

  _wake() {
    if (this.closed) return;
    if (!this.ws) {
      clearTimeout(this.reconnectTimer);
      this._open();
    } else {
      this.resync(); // a phone that slept may have missed events
    }
  }

  _frame(raw) {
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    if (message.type === "queue.snapshot") {
      this._snapshot(message);
    } else if (message.type === "queue.update") {
      if (this.version === null || message.version < this.version) return;
      if (message.version > this.version + 1) {
        this._hold(message);
        return;
      }
      this.version = message.version;
      this._apply(message.state, message.entry);
      this._drain();
      this._render();
    } else if (message.type === "error") {
      this.error = { code: message.code, detail: message.detail };
      this._render();
    }
  }

  _hold(message) {
    this.held.push(message);
    this._armGapTimer();
  }

  _armGapTimer() {
    if (this.gapTimer || this.resyncAsked || !this.held.length) return;
    this.gapTimer = setTimeout(() => {
      this.gapTimer = null;
      if (this.held.length) this.resync(); // the missing version is lost: ask for the truth
    }, this.opts.gapWait);
  }

  /** Apply held updates that have become contiguous; drop the stale ones. */
  _drain() {
    this.held.sort((a, b) => a.version - b.version);
    while (this.held.length && this.held[0].version <= this.version + 1) {
      const message = this.held.shift();
      if (message.version < this.version) continue;
      this.version = message.version;
      this._apply(message.state, message.entry);
    }
    if (!this.held.length) {
      clearTimeout(this.gapTimer);
      this.gapTimer = null;
    }
  }

  _snapshot(message) {
    const now = Date.now();
    const next = new Map();
    let inFlightFor = null;
    for (const entry of message.entries) {
      next.set(entry.id, this._row(stateOf(entry), entry));
      if (entry.blockedByInFlight && entry.inFlightFor != null) {
        inFlightFor = Math.max(inFlightFor ?? 0, entry.inFlightFor);
      }
      if (entry.status === "delivering") {
        const started = Date.parse(entry.lastAttemptAt || "");
        if (!Number.isNaN(started)) inFlightFor = Math.max(0, (now - started) / 1000);
      }
    }
    // What vanished while we were away has ended (sent, most likely, or dismissed).
    for (const [id, row] of this.entries) {
      if (!next.has(id)) this._finish({ ...row, state: "finished" });
    }
    this.entries = next;
    this.leaseSince = inFlightFor === null ? null : now - inFlightFor * 1000;
    this.version = message.version;
    this.connected = true;
    this.error = null;
    this.attempt = 0;
    this.resyncAsked = false;
    this._drain();
    this._armGapTimer(); // updates still waiting beyond the snapshot's version
    this._render();
  }

  _row(state, entry) {
    return {
      id: entry.id,
      clientMessageID: entry.clientMessageID,
      text: entry.text,
      state,
      status: entry.status,
      acceptedAt: entry.acceptedAt,
      entry,
    };
  }

  _finish(row) {
    this.entries.delete(row.id);
    this.finished.delete(row.id);
    this.finished.set(row.id, row);
    while (this.finished.size > this.opts.keepFinished) {
      this.finished.delete(this.finished.keys().next().value);
    }
  }

  _apply(state, entry) {
    if (state === "sent" || state === "dismissed") {
      this._finish(this._row(state, entry));
    } else if (!this.finished.has(entry.id)) {
      this.entries.set(entry.id, this._row(state, entry));
    }
    if (state === "delivering") this.leaseSince = Date.now();
    else if (![...this.entries.values()].some((r) => r.state === "delivering")) {
      this.leaseSince = null;
    }
  }

  /** A 202's entry, in case its queue.update has not arrived yet. */
  _adopt(entry) {
    if (this.entries.has(entry.id) || this.finished.has(entry.id)) return;
    this.entries.set(entry.id, this._row("queued", entry));
    this._render();
  }

  _localChanged() {
    this._render();
  }

  _render() {
    if (this.closed) return;
    const byTime = (a, b) =>
      a.acceptedAt < b.acceptedAt ? -1 : a.acceptedAt > b.acceptedAt ? 1 : 0;
    const live = [...this.entries.values()].sort(byTime).map((row) => {
      const waiting = row.state === "queued" || row.state === "pending";
      const blocked = waiting && this.leaseSince !== null;
      return { ...row, blockedByInFlight: blocked, inFlightSince: blocked ? this.leaseSince : null };
    });
    const done = [...this.finished.values()].sort(byTime);
    const view = {
      workspace: this.workspace,
      session: this.session,
      connected: this.connected,
      version: this.version,
      error: this.error,
      entries: [...done, ...live],
      pending: this.ctx.pending(),
    };
    try {
      this.onChange(view);
    } catch (err) {
      console.error("outbox: onChange failed", err);
    }
  }
}
