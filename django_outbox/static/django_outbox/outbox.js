/**
 * django-outbox browser client: a plain ES module (no build step, no dependencies).
 *
 *   <script type="module">
 *     import { createOutbox } from "/static/django_outbox/outbox.js";
 *     const outbox = createOutbox({ baseURL: "/outbox/", user: userID });
 *     outbox.send("ws1", "ses_1", "Fix the flaky test");          // survives reloads
 *     const sub = outbox.subscribe("ws1", "ses_1", (view) => render(view));
 *     sub.retry(entryID); sub.dismiss(entryID); sub.close();
 *     // steering (docs/howto/steering.md): options of a send, and acting on queued prompts
 *     outbox.send("ws1", "ses_1", "Only if idle", { ifBusy: "reject", expiresAfter: 60 });
 *     sub.edit(entryID, { text: "better words" }); sub.move(entryID, { to: "next" });
 *     sub.cancel(entryID);
 *     sub.stop(); sub.sendNow(entryID);   // cut the running turn (docs/howto/cutting.md)
 *     outbox.stop("ws1", "ses_1", entryID);  // Stop names the turn it stops: the one shown
 *     outbox.send("ws1", "ses_1", "Do this instead", { ifBusy: "interrupt" }); // next, and cut
 *   </script>
 *
 * send() is the client's half of "a disconnect never loses a message": it gives the
 * prompt a clientMessageID (crypto.randomUUID), writes it to localStorage *before* the
 * first POST, under a key of its own (`<storageKey>:pending:<clientMessageID>`, so two
 * tabs never overwrite each other's prompts), and re-POSTs it with the same ID, with
 * backoff, until the server answers 202 (accepted) or 200 (accepted earlier: a duplicate
 * of our own resend). 408, 429, 5xx and network errors are retried (Retry-After is
 * honoured). 401/403 are not a verdict on the prompt: it is kept and *held* (see
 * `hold` in the view) until the same user is logged in again, or, for a refusal by the
 * access policy, until the page reloads or resume() is called. Any other 4xx is final:
 * the prompt is dropped and reported. Unacknowledged prompts are resumed when the page
 * loads again, comes back online or becomes visible. Prompts of one session are sent
 * one at a time, oldest first, so a retry never lets a later prompt overtake it.
 *
 * Who is logged in: the page passes `user` (the ID it was rendered for). Prompts are
 * stored per user and only ever sent for that user: the CSRF token is taken when the
 * client starts (Django rotates it at every login, so a later login in another tab is
 * noticed and the old token is refused by the server anyway), and every client tells the
 * other tabs which user its page was rendered for; a client of another user holds its
 * prompts until its own user is back.
 *
 * subscribe() opens the queue WebSocket (ws/outbox/workspaces/<ws>/sessions/<ses>/),
 * applies the snapshot and then each queue.update by version: older versions are
 * ignored; on a gap (version > current + 1) the update is held for `gapWait` ms, since
 * events published by different processes (the web process's "queued", the worker's
 * "delivering") can arrive out of order; if the missing versions do not turn up by
 * then it sends {"type": "resync"} and applies the fresh snapshot. Updates whose version
 * equals the current one are applied too: one mutation that changes several entries (a
 * recovery, park/unpark) publishes one event per entry with the same version, and
 * re-applying a state is harmless. A snapshot may come in pages ({page, pages}, one
 * version): they are collected and applied together when the last arrives. The socket
 * reconnects with backoff, also after 4429 (too many resyncs: transient), but not after
 * close codes 4400 (invalid ID) or 4403 (refused): those set `view.error` and stop.
 * After 4429 (the user holds too many sockets) and 4503 (the server's store is down) the
 * backoff starts further along: reconnecting at once would only be refused again.
 * A frame carrying "ack" (a snapshot's last page, queue.current) is acknowledged with
 * {"type": "ack", "ack": <token>} once applied: the server sends no further snapshot
 * until the last one is acknowledged, and closes with 4408 a socket that stopped reading
 * (reconnected like 4503: the new socket starts with a fresh snapshot).
 *
 * Every workspace, session and entry ID is checked against the server's rule for IDs
 * (1 to 128 ASCII letters, digits, ".", "_" and "-", starting with a letter or digit)
 * before any URL is built from it, and each path segment is encoded: an ID such as "..",
 * "a/b" or "%2e%2e" (from a page's URL, a message or another user) never becomes a
 * request on another resource. Such an ID is refused with an OutboxError whose code is
 * "invalid_identifier" and status 0 (no request was made): a rejected promise, a thrown
 * error from subscribe(), a "rejected" event for a send().
 */

const PENDING = ":pending:"; // `${storageKey}:pending:${clientMessageID}` holds one prompt
const LEGACY_PENDING = ":pending"; // one list of prompts, written by earlier versions
/** Which user the newest page with a client was rendered for: {user, csrf, at}. */
const LOGIN_KEY = "django-outbox/login";
/** Close codes after which the socket is not reopened: view.error.code for each. */
const FINAL_CLOSE_CODES = new Map([
  [4400, "invalid"],
  [4403, "forbidden"],
  [1003, "refused"],
  [1009, "refused"],
]);
const CLOSE_DETAILS = {
  4400: "the server refused the queue socket: invalid workspace or session ID (4400)",
  4403: "the server refused the queue socket: you may not watch this session, or you " +
    "are not logged in (4403)",
};
/**
 * How a prompt ended, by the state of the update that ended it (row.ended): "expired"
 * is not here, since an expired prompt stays in the queue until dismissed or retried.
 */
const ENDINGS = { sent: "delivered", dismissed: "dismissed", cancelled: "cancelled" };
/**
 * The state a row takes when the snapshot's record of endings (message.ended: [{id, how,
 * at}], newest first) says how a prompt that left the queue while we were not connected
 * ended: the state its update would have had.
 */
const ENDED_STATES = Object.fromEntries(
  Object.entries(ENDINGS).map(([state, ended]) => [ended, state]),
);
/** Transient close codes after which the first reconnect waits longer (backoff step). */
const SLOW_CLOSE_CODES = new Map([
  [4429, 3], // this user holds WS_MAX_SOCKETS_PER_USER sockets: wait for one to close
  [4503, 3], // the server cannot reach its store right now
  [4500, 3], // a server error (e.g. no channel layer configured)
  [4408, 2], // this page did not read what the server sent (a frozen tab): start afresh
]);
/** What a held prompt waits for, by hold code (view.hold.detail). */
const HOLD_DETAILS = {
  not_authenticated:
    "You are not logged in (any more). Your prompts are kept in this browser and are " +
    "sent when you log in again.",
  csrf_failed:
    "The server refused this page's CSRF token: someone logged in on this browser since " +
    "the page was loaded. Your prompts are kept; reload the page (log in again if needed).",
  login_changed:
    "Someone logged in on this browser since this page was loaded. Your prompts are kept; " +
    "reload the page (log in again if needed) to send them.",
  other_user:
    "Another user logged in on this browser. Your prompts are kept here and are sent " +
    "when you log in again.",
  csrf_missing:
    "outbox.js found no CSRF token to send: the CSRF cookie is not readable by JavaScript " +
    "(CSRF_COOKIE_HTTPONLY = True, CSRF_USE_SESSIONS = True, or a CSRF_COOKIE_NAME other " +
    "than the csrfCookie option) and the page has no {% csrf_token %} input " +
    "(name=\"csrfmiddlewaretoken\") or <meta name=\"csrf-token\">. Render {% csrf_token %} " +
    "in the page, or pass createOutbox({csrfToken}) (docs/howto/frontend.md). Your prompts " +
    "are kept in this browser.",
};

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

/**
 * The server's rule for workspace, session and entry IDs (IDENTIFIER_RE in
 * django_outbox/core/rules.py): no "." or ".." segment, no "/", no "%" can pass it.
 */
const IDENTIFIER = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** `value` if it is a valid ID, else throws OutboxError(0, "invalid_identifier"). */
function checkedID(kind, value) {
  if (typeof value === "string" && IDENTIFIER.test(value)) return value;
  const shown =
    typeof value !== "string"
      ? `(a ${value === null ? "null" : typeof value})`
      : JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  throw new OutboxError(
    0,
    "invalid_identifier",
    `Invalid ${kind} ${shown}: an ID is 1 to 128 ASCII letters, digits, '.', '_' and '-', ` +
      "starting with a letter or digit. No request was made.",
  );
}

/** One path segment made of an ID: checked (checkedID), then encoded. */
function segment(kind, value) {
  return encodeURIComponent(checkedID(kind, value));
}

function readCookie(name) {
  const prefix = name + "=";
  for (const part of (globalThis.document?.cookie || "").split(";")) {
    const item = part.trim();
    if (item.startsWith(prefix)) return decodeURIComponent(item.slice(prefix.length));
  }
  return "";
}

/**
 * The CSRF token the page itself rendered, for a cookie JavaScript cannot read
 * (CSRF_COOKIE_HTTPONLY, CSRF_USE_SESSIONS): Django's `{% csrf_token %}` input, as
 * Django's CSRF docs ("Setting the token on the AJAX request") read it, or a
 * `<meta name="csrf-token" content="{{ csrf_token }}">`. "" when the page has neither.
 */
function pageToken() {
  const doc = globalThis.document;
  if (!doc?.querySelector) return "";
  const input = doc.querySelector('input[name="csrfmiddlewaretoken"]');
  if (input?.value) return input.value;
  return doc.querySelector('meta[name="csrf-token"]')?.getAttribute("content") || "";
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

function parseJSON(raw) {
  try {
    return raw ? JSON.parse(raw) : null;
  } catch {
    return null;
  }
}

/** Oldest first: creation time, then this tab's counter, then the ID (any fixed order). */
function byAge(a, b) {
  return (
    (a.createdAt || 0) - (b.createdAt || 0) ||
    (a.seq || 0) - (b.seq || 0) ||
    (a.clientMessageID < b.clientMessageID ? -1 : a.clientMessageID > b.clientMessageID ? 1 : 0)
  );
}

/**
 * What a 401/403 means for the prompts, or null for any other status.
 * {reason: "login"} holds every prompt of this client until its user is logged in again;
 * {reason: "forbidden"} holds the session's prompts (the access policy refused it).
 */
function authHold(status, data, redirected = false) {
  if (redirected) {
    // An API call answered by a redirect (followed by fetch): a login page, most likely
    // (e.g. LoginRequiredMiddleware). Never an acknowledgement.
    return { reason: "login", code: "not_authenticated", status, serverCode: "redirected",
      detail: "the server redirected the request (to a login page?)" };
  }
  if (status !== 401 && status !== 403) return null;
  const code = data?.code || "";
  const detail = data?.detail || "";
  if (status === 401 || code === "not_authenticated" || code === "authentication_failed") {
    return { reason: "login", code: "not_authenticated", status, serverCode: code, detail };
  }
  if (/^CSRF Failed/i.test(detail)) {
    return { reason: "login", code: "csrf_failed", status, serverCode: code, detail };
  }
  return { reason: "forbidden", code: code || "forbidden", status, serverCode: code, detail };
}

/** Rows by acceptedAt (ISO strings sort as times). */
function byTime(a, b) {
  return a.acceptedAt < b.acceptedAt ? -1 : a.acceptedAt > b.acceptedAt ? 1 : 0;
}

/** Live rows in the queue's order: where each stood, then by acceptedAt. */
function inQueueOrder(a, b) {
  return (a.pos ?? 0) - (b.pos ?? 0) || byTime(a, b);
}

/** The display state of a snapshot entry: queued (never tried) or pending (backing off). */
function stateOf(entry) {
  if (entry.status !== "pending") return entry.status;
  const tried = entry.attempts || entry.transientFails || entry.nextAttemptAt;
  return tried ? "pending" : "queued";
}

/**
 * Make a client. Options:
 *   user          the logged-in user's ID as the page was rendered for it (required unless
 *                 storageKey is given): prompts are stored and sent for this user only
 *   baseURL       where django_outbox.urls is mounted (default "/outbox/")
 *   wsURL         origin of the WebSocket routes (default: this page's, ws: or wss:)
 *   csrfToken     a string or a function returning one (default: the CSRF cookie as it
 *                 is when the client is created, or, when JavaScript cannot read it
 *                 (CSRF_COOKIE_HTTPONLY = True), the page's {% csrf_token %} input or
 *                 <meta name="csrf-token">; with none of them a refused POST is held
 *                 with code "csrf_missing" saying what to pass; docs/howto/frontend.md)
 *   csrfCookie    the CSRF cookie's name (default "csrftoken", Django's CSRF_COOKIE_NAME)
 *   csrfHeader    default "X-CSRFToken"
 *   storageKey    prefix of this client's localStorage keys (default "django-outbox:<user>")
 *   requestTimeout  ms before a POST is abandoned and retried (default 15000)
 *   backoff       {initial, max} in ms for resends (default 1000, 30000)
 *   reconnect     {initial, max} in ms for the WebSocket (default 500, 15000)
 *   gapWait       ms an out-of-order update waits for the versions before it (default 500)
 *   keepFinished  how many sent/dismissed entries a view keeps showing (default 50)
 *   workerCheck   ms between two asks whether a worker is alive (view.worker; default
 *                 10000, 0: never ask)
 *   onEvent       (event) => void for sends: {type: "queued"|"accepted"|"duplicate"|
 *                 "retrying"|"held"|"released"|"rejected"|"cancelled"|"storage-error",
 *                 item?, status?, id?, error?, retryIn?, hold?}
 *   storage, fetch, WebSocket, window   injectables (tests); `window` is where the
 *                 online/storage events are listened for (default globalThis)
 */
export function createOutbox(options = {}) {
  const opts = {
    user: null,
    baseURL: "/outbox/",
    wsURL: null,
    csrfToken: null,
    csrfCookie: "csrftoken",
    csrfHeader: "X-CSRFToken",
    storageKey: null,
    requestTimeout: 15000,
    backoff: { initial: 1000, max: 30000 },
    reconnect: { initial: 500, max: 15000 },
    gapWait: 500,
    keepFinished: 50,
    workerCheck: 10000,
    onEvent: null,
    storage: globalThis.localStorage,
    fetch: null,
    WebSocket: globalThis.WebSocket,
    window: globalThis,
    ...options,
  };
  const user = opts.user === null || opts.user === undefined ? "" : String(opts.user);
  if (!user && !opts.storageKey) {
    throw new TypeError(
      "createOutbox: pass `user` (the logged-in user's ID), so that prompts are kept and " +
        "sent per user",
    );
  }
  const base = opts.baseURL.endsWith("/") ? opts.baseURL : opts.baseURL + "/";
  const storageKey = opts.storageKey || `django-outbox:${user}`;
  const prefix = storageKey + PENDING;
  const legacyKey = storageKey + LEGACY_PENDING;
  const storage = opts.storage || null;
  const win = opts.window || null;
  const inFlight = new Set(); // pair keys with a POST on the wire from this tab
  const waiters = new Map(); // clientMessageID -> {resolve, reject, item, promise}
  const progress = new Map(); // clientMessageID -> {attempts, nextAt, lastError, sending}
  const unstored = new Map(); // clientMessageID -> item this tab could not store
  const sessionHolds = new Map(); // pair key -> hold (the access policy refused)
  const subscriptions = new Set();
  const listeners = new Set(opts.onEvent ? [opts.onEvent] : []);
  let loginHold = null; // {reason: "login", code, status, detail, since}
  let seq = 0;
  let timer = null;
  let closed = false;

  // -- the CSRF token: the one of the login this page was rendered for ---------------

  // Django rotates the CSRF cookie at every login: its value when the page was rendered
  // marks that login, whichever token mode is used.
  let loginMark = readCookie(opts.csrfCookie);
  const cookieMode = !opts.csrfToken;
  // An HttpOnly cookie is invisible here: the token the page rendered is the same login's.
  let token = cookieMode
    ? loginMark || pageToken()
    : typeof opts.csrfToken === "string"
      ? opts.csrfToken
      : "";

  function csrf() {
    if (typeof opts.csrfToken === "function") return opts.csrfToken();
    if (cookieMode && !token) token = loginMark = readCookie(opts.csrfCookie); // none at start
    if (cookieMode && !token) token = pageToken();
    return token;
  }

  /** True when a login happened on this browser since this page's login. */
  function loginChanged() {
    if (!loginMark) return false;
    const now = readCookie(opts.csrfCookie);
    return Boolean(now) && now !== loginMark;
  }

  // Every URL of the API is built here, from checked IDs only (see segment()).
  const sessionURL = (workspace, session) =>
    `${base}api/workspaces/${segment("workspace ID", workspace)}/sessions/` +
    `${segment("session ID", session)}/`;
  const messagesURL = (workspace, session) => `${sessionURL(workspace, session)}messages/`;
  const entryURL = (workspace, session, id) =>
    `${messagesURL(workspace, session)}${segment("entry ID", id)}/`;

  /** The OutboxError refusing a prompt's workspace or session ID, or null if both are valid. */
  function idError(item) {
    try {
      sessionURL(item.workspace, item.session);
      return null;
    } catch (error) {
      return error;
    }
  }

  const doFetch = (url, init) => (opts.fetch ? opts.fetch(url, init) : globalThis.fetch(url, init));

  // -- localStorage: one key per prompt, written once, removed once ------------------

  function storageError(err) {
    // Quota exceeded or storage disabled: the send still runs, it just won't survive
    // a reload. Say so rather than fail.
    emit({ type: "storage-error", error: String(err) });
  }

  function validItem(item) {
    return (
      item &&
      typeof item === "object" &&
      typeof item.clientMessageID === "string" &&
      typeof item.text === "string" &&
      item.workspace !== undefined &&
      item.session !== undefined &&
      !item.outcome &&
      (item.user === undefined || item.user === user || !user)
    );
  }

  /** Every unacknowledged prompt of this user in this browser, oldest first. */
  function all() {
    const found = new Map();
    if (storage) {
      try {
        for (let i = 0; i < storage.length; i++) {
          const key = storage.key(i);
          if (!key || !key.startsWith(prefix)) continue;
          const item = parseJSON(storage.getItem(key));
          if (validItem(item)) found.set(item.clientMessageID, item);
        }
      } catch (err) {
        storageError(err);
      }
    }
    for (const [id, item] of unstored) if (!found.has(id)) found.set(id, item);
    return [...found.values()].sort(byAge);
  }

  function find(clientMessageID) {
    const item = parseJSON(storage?.getItem(prefix + clientMessageID) ?? null);
    return validItem(item) ? item : unstored.get(clientMessageID) || null;
  }

  function store(item) {
    try {
      if (!storage) throw new Error("no localStorage");
      storage.setItem(prefix + item.clientMessageID, JSON.stringify(item));
    } catch (err) {
      unstored.set(item.clientMessageID, item);
      storageError(err);
    }
  }

  /** Prompts left in the single list of earlier versions get a key each. */
  function migrate() {
    if (!storage) return;
    try {
      const items = parseJSON(storage.getItem(legacyKey));
      if (!items) return;
      for (const old of Array.isArray(items) ? items : []) {
        if (!old?.clientMessageID || storage.getItem(prefix + old.clientMessageID)) continue;
        const item = { ...old };
        for (const name of ["sending", "attempts", "nextAt", "lastError"]) delete item[name];
        storage.setItem(prefix + item.clientMessageID, JSON.stringify(item));
      }
      storage.removeItem(legacyKey);
    } catch (err) {
      storageError(err);
    }
  }

  /**
   * A prompt's fate is decided: tell the other tabs how it ended (the storage event of
   * the outcome record, removed at once), forget it, settle its send() if it is ours.
   * outcome: {type: "accepted"|"duplicate", status, id, entry} | {type: "rejected",
   * status, code, detail} | {type: "cancelled"}.
   */
  function settle(item, outcome) {
    const id = item.clientMessageID;
    const key = prefix + id;
    try {
      if (storage && storage.getItem(key) !== null) {
        storage.setItem(key, JSON.stringify({ ...item, outcome }));
        storage.removeItem(key);
      }
    } catch {
      try {
        storage.removeItem(key);
      } catch (err) {
        storageError(err);
      }
    }
    unstored.delete(id);
    progress.delete(id);
    finish(id, outcome);
  }

  /** Settle this tab's send() promise of a prompt, however its fate was learned. */
  function finish(clientMessageID, outcome) {
    const waiter = waiters.get(clientMessageID);
    if (!waiter) return;
    waiters.delete(clientMessageID);
    if (outcome.type === "accepted" || outcome.type === "duplicate") {
      waiter.resolve({ status: outcome.type, id: outcome.id, entry: outcome.entry ?? null });
    } else if (outcome.type === "cancelled") {
      waiter.reject(new OutboxError(0, "cancelled", "cancelled before it was acknowledged"));
    } else {
      waiter.reject(new OutboxError(outcome.status, outcome.code, outcome.detail));
    }
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

  // -- holds: 401/403 keep the prompts until the same user is logged in again --------

  function holdLogin(code, details = {}, item = null) {
    loginHold = {
      reason: "login",
      code,
      status: details.status ?? 0,
      serverCode: details.serverCode ?? "",
      detail: HOLD_DETAILS[code] || details.detail || "log in again",
      serverDetail: details.detail ?? "",
      since: Date.now(),
    };
    clearTimeout(timer);
    timer = null;
    // This page's user is gone from the browser: stop watching as them (a reconnect
    // would carry the other user's cookie).
    if (code === "other_user") for (const sub of subscriptions) sub._suspend(loginHold.detail);
    emit({ type: "held", hold: loginHold, item, status: loginHold.status });
  }

  function holdSession(key, hold, item) {
    const kept = { ...hold, serverDetail: hold.detail };
    kept.detail =
      `${hold.detail || `HTTP ${hold.status}`} Your prompt is kept in this browser; it is ` +
      "sent again when the page reloads (or outbox.resume() is called).";
    kept.since = Date.now();
    sessionHolds.set(key, kept);
    emit({ type: "held", hold: kept, item, status: hold.status });
  }

  /** The hold that keeps a session's prompts from being sent, or null. */
  function holdOf(workspace, session) {
    return loginHold || sessionHolds.get(pairKey(workspace, session)) || null;
  }

  /**
   * The page (or another tab) says who is logged in now. The client's own user: take the
   * new CSRF token, lift every hold, resend now, reopen sockets a 4403 closed. Another
   * user: hold everything until ours is back.
   */
  function loggedIn(who = user, csrfToken = undefined, { announce = true } = {}) {
    if (closed) return false;
    if (user && String(who) !== user) {
      holdLogin("other_user");
      return false;
    }
    loginMark = readCookie(opts.csrfCookie);
    if (cookieMode) token = loginMark || csrfToken || token;
    else if (typeof opts.csrfToken === "string" && csrfToken) token = csrfToken;
    const was = loginHold || sessionHolds.size;
    loginHold = null;
    sessionHolds.clear();
    for (const state of progress.values()) state.nextAt = 0;
    if (announce) announceLogin();
    for (const sub of subscriptions) sub._loggedIn();
    if (was) emit({ type: "released" });
    pump();
    return true;
  }

  function announceLogin() {
    if (!user || !storage) return;
    try {
      const csrfNow = typeof opts.csrfToken === "function" ? "" : token;
      storage.setItem(LOGIN_KEY, JSON.stringify({ user, csrf: csrfNow, at: Date.now() }));
    } catch (err) {
      storageError(err);
    }
  }

  // -- sending -------------------------------------------------------------------------

  function send(workspace, session, text, sendOptions = {}) {
    const item = {
      workspace,
      session,
      text,
      clientMessageID: sendOptions.clientMessageID || randomID(),
      createdAt: Date.now(),
      seq: ++seq,
    };
    const invalid = idError(item);
    if (invalid) {
      // Never stored, never sent: the server would refuse it, and its URL could name
      // another resource.
      emit({ type: "rejected", item, status: 0, error: invalid });
      return Promise.reject(invalid);
    }
    if (user) item.user = user;
    if (sendOptions.model !== undefined) item.model = sendOptions.model;
    // Accept options (docs/howto/steering.md); an unknown one is the server's 400, final.
    if (sendOptions.ifBusy !== undefined) item.ifBusy = sendOptions.ifBusy;
    if (sendOptions.expiresAfter !== undefined) item.expiresAfter = sendOptions.expiresAfter;
    const known = waiters.get(item.clientMessageID);
    if (known) return known.promise;
    let waiter;
    const done = new Promise((resolve, reject) => {
      waiter = { resolve, reject, item };
    });
    waiter.promise = done;
    waiters.set(item.clientMessageID, waiter);
    store(item); // durable before the first byte goes out
    emit({ type: "queued", item });
    pump();
    return done;
  }

  function progressOf(clientMessageID) {
    let state = progress.get(clientMessageID);
    if (!state) {
      state = { attempts: 0, nextAt: 0, lastError: "", sending: false };
      progress.set(clientMessageID, state);
    }
    return state;
  }

  /** Schedule the next POST of each session's oldest unacknowledged prompt. */
  function pump() {
    if (closed) return;
    clearTimeout(timer);
    timer = null;
    if (loginHold) {
      // Nothing goes out until our user is logged in again. A login since we were
      // refused may be anyone's: say "reload" rather than guess.
      if (loginHold.code === "not_authenticated" && loginChanged()) holdLogin("login_changed");
      return;
    }
    const now = Date.now();
    const items = all();
    // One of our send()s whose prompt is gone from storage without our hearing how it
    // ended (a page back from the back/forward cache misses storage events; storage
    // cleared): ask the server again with the same clientMessageID (200 if accepted).
    const present = new Set(items.map((x) => x.clientMessageID));
    let missing = false;
    for (const [id, waiter] of waiters) {
      if (!present.has(id)) {
        unstored.set(id, waiter.item);
        missing = true;
      }
    }
    const heads = new Map();
    for (const item of missing ? all() : items) {
      const invalid = idError(item);
      if (invalid) {
        // Left by an earlier version or another page: final, reported, never sent.
        settle(item, { type: "rejected", status: 0, code: invalid.code, detail: invalid.detail });
        emit({ type: "rejected", item, status: 0, error: invalid });
        continue;
      }
      const key = pairKey(item.workspace, item.session);
      if (!heads.has(key)) heads.set(key, item);
    }
    let wake = Infinity;
    for (const [key, item] of heads) {
      if (inFlight.has(key) || sessionHolds.has(key)) continue;
      const nextAt = progress.get(item.clientMessageID)?.nextAt || 0;
      if (nextAt > now) {
        wake = Math.min(wake, nextAt);
        continue;
      }
      if (loginChanged()) {
        holdLogin("login_changed", {}, item);
        return;
      }
      post(key, item);
    }
    if (wake !== Infinity) timer = setTimeout(pump, Math.max(0, wake - Date.now()));
  }

  async function post(key, item) {
    const url = messagesURL(item.workspace, item.session); // pump() checked its IDs
    inFlight.add(key);
    const state = progressOf(item.clientMessageID);
    const body = { clientMessageID: item.clientMessageID, text: item.text };
    if (item.model !== undefined) body.model = item.model;
    if (item.ifBusy !== undefined) body.ifBusy = item.ifBusy;
    if (item.expiresAfter !== undefined) body.expiresAfter = item.expiresAfter;
    const controller = new AbortController();
    const abort = setTimeout(() => controller.abort(), opts.requestTimeout);
    let status = 0;
    let data = null;
    let retryAfter = 0;
    let redirected = false;
    let error = "";
    const sentToken = csrf();
    state.sending = true;
    emit({ type: "sending", item });
    try {
      const response = await doFetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          Accept: "application/json",
          [opts.csrfHeader]: sentToken,
        },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      status = response.status;
      redirected = Boolean(response.redirected);
      retryAfter = Number(response.headers.get("Retry-After")) || 0;
      data = await response.json().catch(() => null);
    } catch (err) {
      error = err?.name === "AbortError" ? "request timed out" : String(err?.message || err);
    } finally {
      clearTimeout(abort);
      inFlight.delete(key);
      state.sending = false;
    }
    let hold = authHold(status, data, redirected);
    // Refused for want of a token we never had: not a login matter, a page to fix.
    if (hold?.code === "csrf_failed" && !sentToken) hold = { ...hold, code: "csrf_missing" };
    // An acknowledgement names the entry; a 200 without one (an HTML page from a proxy,
    // say) proves nothing and is retried like a 5xx.
    const acked = !hold && (status === 202 || status === 200) && typeof data?.id === "string";
    if (acked) {
      const type = status === 202 ? "accepted" : "duplicate";
      const entry = status === 202 ? data : null;
      if (entry) adopt(item, entry);
      settle(item, { type, status, id: data?.id, entry });
      emit({ type, item, status, id: data?.id, entry });
    } else if (hold) {
      state.lastError = `HTTP ${status}${hold.serverCode ? " " + hold.serverCode : ""}`;
      if (hold.reason === "login") holdLogin(hold.code, hold, item);
      else holdSession(key, hold, item);
    } else if (status >= 300 && status < 500 && status !== 408 && status !== 429) {
      const error = new OutboxError(status, data?.code, data?.detail);
      settle(item, { type: "rejected", status, code: error.code, detail: error.detail });
      emit({ type: "rejected", item, status, error });
    } else if (find(item.clientMessageID)) {
      state.attempts += 1;
      let delay = backoffDelay(state.attempts, opts.backoff);
      if (retryAfter) delay = Math.max(delay, Math.min(retryAfter * 1000, 5 * opts.backoff.max));
      state.nextAt = Date.now() + delay;
      state.lastError = error || `HTTP ${status}${data?.code ? " " + data.code : ""}`;
      emit({ type: "retrying", item, status, error: state.lastError, retryIn: delay });
    }
    pump();
  }

  /** Hand a 202's entry to the views of its session (the WebSocket may be slower). */
  function adopt(item, entry) {
    for (const sub of subscriptions) {
      if (sub.workspace === item.workspace && sub.session === item.session) sub._adopt(entry);
    }
  }

  /**
   * The prompts of a session (or all) not yet acknowledged by the server, oldest first:
   * [{clientMessageID, workspace, session, text, model?, createdAt, attempts, nextAt,
   *   lastError, sending, held}] where held is the hold's reason ("login"|"forbidden") or
   * null. attempts/nextAt/lastError/sending are this tab's own tries.
   */
  function pending(workspace, session) {
    return all()
      .filter(
        (x) => workspace === undefined || (x.workspace === workspace && x.session === session),
      )
      .map((x) => {
        const state = progress.get(x.clientMessageID);
        return {
          ...x,
          attempts: state?.attempts || 0,
          nextAt: state?.nextAt || 0,
          lastError: state?.lastError || "",
          sending: Boolean(state?.sending),
          held: holdOf(x.workspace, x.session)?.reason || null,
        };
      });
  }

  /**
   * Stop resending a prompt that was never acknowledged (a POST on the wire may still
   * land): cancel(clientMessageID). With three arguments, cancel(workspace, session, id)
   * cancels a queued prompt on the server instead (see cancelMessage; any call with more
   * than one argument is that one, so a missing ID is refused, never taken for the other).
   */
  function cancel(clientMessageID, session, id) {
    if (arguments.length > 1) return cancelMessage(clientMessageID, session, id);
    const item = find(clientMessageID) ||
      waiters.get(clientMessageID)?.item || { clientMessageID };
    // The session's next prompt gets its own try (the refusal was this one's).
    if (item.workspace !== undefined) sessionHolds.delete(pairKey(item.workspace, item.session));
    settle(item, { type: "cancelled" });
    emit({ type: "cancelled", item });
    pump();
  }

  // -- retry / dismiss -------------------------------------------------------------------

  async function call(method, url, body, headers = {}) {
    if (loginChanged() && loginHold?.code !== "other_user") holdLogin("login_changed");
    if (loginHold?.code === "login_changed" || loginHold?.code === "other_user") {
      throw new OutboxError(0, loginHold.code, loginHold.detail);
    }
    const sentToken = csrf();
    const init = {
      method,
      credentials: "same-origin",
      headers: { Accept: "application/json", [opts.csrfHeader]: sentToken, ...headers },
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await doFetch(url, init);
    const data = response.status === 204 ? null : await response.json().catch(() => null);
    if (!sentToken && response.status === 403 && /^CSRF Failed/i.test(data?.detail || "")) {
      throw new OutboxError(403, "csrf_missing", HOLD_DETAILS.csrf_missing);
    }
    if (response.redirected) {
      const detail = "the server redirected the request (to a login page?)";
      throw new OutboxError(response.status, "not_authenticated", detail);
    }
    if (!response.ok) throw new OutboxError(response.status, data?.code, data?.detail);
    return data;
  }

  // Each method below is async: an invalid ID rejects its promise (OutboxError
  // "invalid_identifier", status 0) and no request is made.

  /** Re-arm an entry (error → pending, or skip its backoff). 404/409 throw OutboxError. */
  async function retry(workspace, session, id) {
    return call("POST", `${entryURL(workspace, session, id)}retry/`);
  }

  /** Remove an entry from the queue. 404/409 (busy: being delivered) throw OutboxError. */
  async function dismiss(workspace, session, id) {
    return call("DELETE", entryURL(workspace, session, id));
  }

  // -- steering (docs/howto/steering.md) ----------------------------------------------

  /**
   * Edit a waiting prompt: change = {text?, model?}. `version` (the session version you
   * last saw) is sent as If-Match: 412 version_mismatch if the queue changed since. 409
   * busy once it is being delivered or verified, 404 gone: all throw OutboxError.
   */
  async function edit(workspace, session, id, change, { version } = {}) {
    const headers = version === undefined || version === null ? {} : { "If-Match": `"${version}"` };
    return call("PATCH", entryURL(workspace, session, id), change, headers);
  }

  /** Reorder a queued prompt: place = {before: id} or {to: "next" | "last"}. */
  async function move(workspace, session, id, place) {
    const url = `${entryURL(workspace, session, id)}move/`;
    const before = place && typeof place === "object" && "before" in place;
    if (before) checkedID("entry ID", place.before);
    return call("POST", url, place);
  }

  /** Cancel a queued prompt on the server (removed, as dismiss). 409 while in flight. */
  async function cancelMessage(workspace, session, id) {
    return call("POST", `${entryURL(workspace, session, id)}cancel/`);
  }

  // -- cutting the running turn (docs/howto/cutting.md) ----------------------------------

  /**
   * "Stop": cut the running turn of entry `entryID` (the one the page shows in flight)
   * and send nothing new. Resolves to {result: "cut"|"already"}; 409 not_in_flight (that
   * entry is not in flight any more: its turn ended, or another one runs; nothing was
   * cut) and 409 not_supported (no aborter) throw OutboxError. The cut prompt ends
   * verified: sent with `interrupted: true`, or cancelled. The 2-argument call
   * stop(workspace, session) names no entry and cuts whatever turn runs when the request
   * arrives ({result: "idle"} when none does): pressed as a turn ends, it may cut the next
   * prompt's turn. A third argument that is no valid ID (undefined, null included) is
   * refused like any bad ID: it never falls back to that meaning.
   */
  async function stop(workspace, session, entryID) {
    const url = `${sessionURL(workspace, session)}interrupt/`;
    if (arguments.length < 3) return call("POST", url);
    return call("POST", url, { entryID: checkedID("entry ID", entryID) });
  }

  /**
   * Make a queued prompt the next one and cut the running turn. Resolves to
   * {result: "cut"|"already"|"moved"}; 404, 409 busy (not a queued prompt) and 409
   * not_supported throw OutboxError.
   */
  async function sendNow(workspace, session, id) {
    return call("POST", `${entryURL(workspace, session, id)}send-now/`);
  }

  // -- watching ------------------------------------------------------------------------

  /** Watch a session's queue. An invalid ID throws OutboxError (invalid_identifier). */
  function subscribe(workspace, session, onChange) {
    const workerURL = `${sessionURL(workspace, session)}worker/`; // checks both IDs
    const sub = new Subscription(workspace, session, onChange, {
      opts,
      pending: () => pending(workspace, session),
      hold: () => holdOf(workspace, session),
      retry: (id) => retry(workspace, session, id),
      dismiss: (id) => dismiss(workspace, session, id),
      edit: (id, change, options) => edit(workspace, session, id, change, options),
      move: (id, place) => move(workspace, session, id, place),
      cancel: (id) => cancelMessage(workspace, session, id),
      stop: (entryID) => stop(workspace, session, entryID),
      sendNow: (id) => sendNow(workspace, session, id),
      workerURL,
      fetch: doFetch,
      forget: () => subscriptions.delete(sub),
    });
    subscriptions.add(sub);
    sub._open();
    sub._checkWorker();
    return sub;
  }

  // -- other tabs, and waking up ----------------------------------------------------------

  const refresh = () => {
    for (const sub of subscriptions) sub._localChanged({ type: "storage" });
    pump();
  };

  /** Another tab changed one of our prompts' keys. */
  function otherTabChanged(clientMessageID, newValue) {
    const value = parseJSON(newValue);
    if (value?.outcome) {
      // Another tab learned its fate (or cancelled it): settle ours the same way.
      progress.delete(clientMessageID);
      unstored.delete(clientMessageID);
      finish(clientMessageID, value.outcome);
    }
    // Gone without a word: pump() asks the server about our own (see there).
  }

  const onStorage = (event) => {
    if (closed || (event.storageArea && storage && event.storageArea !== storage)) return;
    const key = event.key;
    if (key === null) {
      // clear(): pump() resends our unsettled prompts from memory (idempotent).
    } else if (key === LOGIN_KEY) {
      const login = parseJSON(event.newValue);
      if (login && user) loggedIn(login.user, login.csrf, { announce: false });
      return;
    } else if (key === legacyKey) {
      migrate();
    } else if (key.startsWith(prefix)) {
      otherTabChanged(key.slice(prefix.length), event.newValue);
    } else {
      return;
    }
    refresh();
  };
  const onOnline = () => {
    // Back online: resend now instead of waiting out the backoff.
    for (const state of progress.values()) state.nextAt = 0;
    pump();
  };
  const onVisible = () => {
    if (globalThis.document?.visibilityState !== "visible") return;
    pump();
    for (const sub of subscriptions) sub._wake();
  };
  const onPageShow = (event) => {
    if (event.persisted) onVisible(); // back from the back/forward cache
  };
  win?.addEventListener?.("online", onOnline);
  win?.addEventListener?.("storage", onStorage);
  win?.addEventListener?.("pageshow", onPageShow);
  globalThis.document?.addEventListener?.("visibilitychange", onVisible);

  function close() {
    closed = true;
    clearTimeout(timer);
    for (const sub of [...subscriptions]) sub.close();
    win?.removeEventListener?.("online", onOnline);
    win?.removeEventListener?.("storage", onStorage);
    win?.removeEventListener?.("pageshow", onPageShow);
    globalThis.document?.removeEventListener?.("visibilitychange", onVisible);
  }

  /** Resend now what is due, and give prompts the access policy refused one more try. */
  function resume() {
    sessionHolds.clear();
    for (const state of progress.values()) state.nextAt = 0;
    refresh();
  }

  // This page was rendered for `user`: tell the other tabs, then resume what an earlier
  // page left unacknowledged.
  migrate();
  announceLogin();
  pump();

  return {
    send,
    subscribe,
    retry,
    dismiss,
    edit,
    move,
    stop,
    sendNow,
    pending,
    cancel,
    close,
    resume,
    loggedIn: (who, csrfToken) => loggedIn(who === undefined ? user : who, csrfToken),
    /** The hold keeping prompts back (a session's, or the login's), or null. */
    hold: (workspace, session) =>
      workspace === undefined ? loginHold : holdOf(workspace, session),
    user,
    on(fn) {
      listeners.add(fn);
      return () => listeners.delete(fn);
    },
  };
}

/**
 * One session's live queue. onChange(view) is called after every change with
 *   {workspace, session, connected, version, error, hold,
 *    entries: [{id, clientMessageID, text, state, stop, entry, blockedByInFlight, inFlightSince}],
 *    pending: [{clientMessageID, text, attempts, nextAt, lastError, sending, held}]}
 * entries are the server's (FIFO by acceptedAt), finished ones (state "sent",
 * "dismissed", "cancelled", or "finished" when it ended unseen) included; a finished
 * row's `ended` says how: "delivered", "dismissed", "cancelled", or null when it ended
 * unseen. A row that ended while the socket was down is told by the next snapshot's
 * record of recent endings (the last 20 of the last hour): it gets the state and `ended`
 * it would have had, and `endedAt` (when, ISO); only one the record no longer holds is
 * "finished" with `ended` null. An expired row (it stays in the queue until dismissed or
 * retried) has `ended` "expired". A row whose turn a Stop cut has `stop` "stopping" while
 * its outcome is verified, then "stopped" once it ended (sent or cancelled); else null.
 * worker is whether a worker is
 * alive to deliver ({alive, lastSeen, checkedAt}, asked every workerCheck ms) or null
 * while unknown;
 * pending are this browser's prompts not yet acknowledged. inFlightSince is a
 * Date.now()-style time: show "blocked behind an in-flight message for N s".
 * error is the socket's ({code: "forbidden"|"invalid"|"refused", detail} after a final
 * close code, or an error frame); hold is why this session's prompts are not being sent
 * ({reason: "login"|"forbidden", code, status, detail, since}) or null.
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
    this.paging = null; // {version, pages, next, entries} while a paged snapshot arrives
    this.gapTimer = null;
    this.closed = false;
    this.stopped = null; // the final close code that stopped reconnecting
    this.worker = null; // {alive, lastSeen, checkedAt} once asked (GET .../worker/)
    this.workerTimer = null;
    this.workerChecking = false;
  }

  /** Ask whether a worker is alive, then again every workerCheck ms while subscribed. */
  async _checkWorker() {
    // One check at a time: a wake-up during a check leaves that check to re-arm the timer.
    if (this.workerChecking) return;
    clearTimeout(this.workerTimer);
    this.workerTimer = null;
    if (this.closed || !this.opts.workerCheck) return;
    this.workerChecking = true;
    try {
      const response = await this.ctx.fetch(this.ctx.workerURL, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      const data = response.ok ? await response.json().catch(() => null) : null;
      if (data && typeof data.alive === "boolean") {
        const was = this.worker?.alive;
        this.worker = { alive: data.alive, lastSeen: data.lastSeen ?? null, checkedAt: Date.now() };
        if (was !== data.alive) this._render();
      }
    } catch {
      // Offline or refused: what we knew stands; the socket's state says the rest.
    } finally {
      this.workerChecking = false;
    }
    if (!this.closed) this.workerTimer = setTimeout(() => this._checkWorker(), this.opts.workerCheck);
  }

  retry(id) {
    return this.ctx.retry(id);
  }

  dismiss(id) {
    return this.ctx.dismiss(id);
  }

  /** Edit a waiting prompt ({text?, model?}), If-Match this view's version by default. */
  edit(id, change, { version = this.version } = {}) {
    return this.ctx.edit(id, change, { version });
  }

  /** Reorder a queued prompt: {before: id} or {to: "next" | "last"}. */
  move(id, place) {
    return this.ctx.move(id, place);
  }

  /** Cancel a queued prompt on the server. */
  cancel(id) {
    return this.ctx.cancel(id);
  }

  /**
   * "Stop": cut the turn of entry `entryID` as the client's stop() does; sub.stop()
   * without an argument names the entry this view shows in flight (being delivered, else
   * the first being verified). With nothing shown in flight it rejects with OutboxError
   * "not_in_flight" (status 0) and makes no request: a Stop cuts the turn the user saw
   * or nothing.
   */
  async stop(...named) {
    const entryID = named.length ? named[0] : this.inFlightID();
    if (!named.length && entryID === null) {
      const detail = "No prompt is in flight in this view; nothing was cut.";
      throw new OutboxError(0, "not_in_flight", detail);
    }
    return this.ctx.stop(entryID);
  }

  /** The ID of the entry this view shows in flight, or null: see stop(). */
  inFlightID() {
    const rows = [...this.entries.values()].sort(inQueueOrder);
    const was = (row, status) =>
      row.state === status || (row.state === "parked" && row.entry?.parkedFrom === status);
    const row = rows.find((r) => was(r, "delivering")) || rows.find((r) => was(r, "verifying"));
    return row?.id ?? null;
  }

  /** Make queued prompt `id` the next one and cut the running turn. */
  sendNow(id) {
    return this.ctx.sendNow(id);
  }

  /** Ask the server for a fresh snapshot (also done automatically on a version gap). */
  resync() {
    if (this.ws?.readyState === 1) {
      this.resyncAsked = true;
      this.ws.send(JSON.stringify({ type: "resync" }));
    }
  }

  /** Open the socket again after a final close code (4403, 4400) stopped it. */
  reconnect() {
    if (this.closed) return;
    this.stopped = null;
    this.error = null;
    this.attempt = 0;
    clearTimeout(this.reconnectTimer);
    if (!this.ws) this._open();
    this._render();
  }

  close() {
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.gapTimer);
    clearTimeout(this.workerTimer);
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
      `${origin}ws/outbox/workspaces/${segment("workspace ID", this.workspace)}` +
      `/sessions/${segment("session ID", this.session)}/`
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
      this.paging = null;
      clearTimeout(this.gapTimer);
      this.gapTimer = null;
      if (this.closed) return;
      if (FINAL_CLOSE_CODES.has(event.code)) {
        this.stopped = event.code;
        this.error = {
          code: FINAL_CLOSE_CODES.get(event.code),
          closeCode: event.code,
          detail:
            CLOSE_DETAILS[event.code] || `the server closed the queue socket (${event.code})`,
        };
        this._render();
        return;
      }
      this.attempt = Math.max(this.attempt + 1, SLOW_CLOSE_CODES.get(event.code) || 0);
      const delay = backoffDelay(this.attempt, this.opts.reconnect);
      this._render();
      this.reconnectTimer = setTimeout(() => this._open(), delay);
    };
  }

  /** Another user logged in on this browser: close the socket until ours is back. */
  _suspend(detail) {
    if (this.closed) return;
    this.stopped = "other_user";
    this.error = { code: "other_user", detail };
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.gapTimer);
    this.gapTimer = null;
    this.held = [];
    this.paging = null;
    this.resyncAsked = false;
    const ws = this.ws;
    this.ws = null;
    this.connected = false;
    ws?.close(1000);
    this._render();
  }

  /** Our user logged in again: a socket a 4403 or another user's login stopped reopens. */
  _loggedIn() {
    if (this.stopped === 4403 || this.stopped === "other_user") this.reconnect();
    else this._render();
  }

  _wake() {
    if (this.closed || this.stopped) return;
    this._checkWorker(); // a page that slept asks again now
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
      if ((message.pages ?? 1) > 1) this._page(message);
      else {
        this.paging = null;
        this._snapshot(message);
      }
    } else if (message.type === "queue.update") {
      if (this.paging) {
        this.held.push(message); // applied (or dropped as stale) once the snapshot is whole
        return;
      }
      if (this.version === null || message.version < this.version) return;
      if (message.version > this.version + 1) {
        this._hold(message);
        return;
      }
      this.version = message.version;
      this._apply(message.state, message.entry);
      this._drain();
      this._render();
    } else if (message.type === "queue.current") {
      // The server had nothing newer for our resync: our view is the latest.
      this.resyncAsked = false;
      this._armGapTimer();
    } else if (message.type === "error") {
      this.error = { code: message.code, detail: message.detail };
      this._render();
    }
    this._acknowledge(message);
  }

  /** Tell the server this frame (and everything before it) was read. */
  _acknowledge(message) {
    if (typeof message.ack !== "string" || this.ws?.readyState !== 1) return;
    // A snapshot is acknowledged once applied whole (not a page set dropped midway).
    if (message.type === "queue.snapshot" && (this.paging || this.version !== message.version)) {
      return;
    }
    this.ws.send(JSON.stringify({ type: "ack", ack: message.ack }));
  }

  /**
   * One page of a snapshot split by the server (pages 1..pages, one version): collect
   * them and apply the snapshot when the last arrives. A new page 1 drops an unfinished
   * set; a page that does not follow drops the set and asks for a fresh snapshot.
   */
  _page(message) {
    const set = this.paging;
    if (message.page === 1) {
      this.paging = { version: message.version, pages: message.pages, next: 2,
        entries: [...(message.entries || [])] };
    } else if (set && message.page === set.next && message.version === set.version &&
               message.pages === set.pages) {
      set.entries.push(...(message.entries || []));
      set.next += 1;
    } else {
      this.paging = null;
      this.resync();
      return;
    }
    if (this.paging.next > this.paging.pages) {
      const entries = this.paging.entries;
      this.paging = null;
      this._snapshot({ ...message, page: 1, pages: 1, entries });
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
      // The snapshot lists the queue in its order (moves included): rows keep that place.
      next.set(entry.id, { ...this._row(stateOf(entry), entry), pos: next.size });
      if (entry.blockedByInFlight && entry.inFlightFor != null) {
        inFlightFor = Math.max(inFlightFor ?? 0, entry.inFlightFor);
      }
      if (entry.status === "delivering") {
        const started = Date.parse(entry.lastAttemptAt || "");
        if (!Number.isNaN(started)) inFlightFor = Math.max(0, (now - started) / 1000);
      }
    }
    // What vanished while we were away has ended: the record of recent endings says how
    // (newest first: an entry's first item is its last ending), else it ended unseen.
    const endings = new Map();
    for (const ending of Array.isArray(message.ended) ? message.ended : []) {
      if (ending && typeof ending.id === "string" && !endings.has(ending.id)) {
        endings.set(ending.id, ending);
      }
    }
    for (const [id, row] of this.entries) {
      if (next.has(id)) continue;
      const ending = endings.get(id);
      const known = ending && Object.hasOwn(ENDED_STATES, ending.how);
      const state = known ? ENDED_STATES[ending.how] : null;
      this._finish(state
        ? { ...row, state, ended: ending.how, endedAt: ending.at ?? null }
        : { ...row, state: "finished", ended: null });
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
      // An expired prompt ended without being sent, though it stays in the queue.
      ended: Object.hasOwn(ENDINGS, state) ? ENDINGS[state] : state === "expired" ? state : null,
      // A Stop cut its turn (docs/howto/cutting.md): "stopping" until the verifier decides,
      // then "stopped" as it ends, sent (the agent had it) or cancelled (never sent). Never
      // a failure: its lastError says the cut, not the agent.
      stop: entry.interrupted !== true ? null : Object.hasOwn(ENDINGS, state) ? "stopped" : "stopping",
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
    // A move changes the queue's order, which an update does not carry: ask for a snapshot.
    if (state === "moved") this.resync();
    // A change that leaves the prompt where it was (an edit, a move) shows its status.
    if (state === "edited" || state === "moved") state = stateOf(entry);
    if (Object.hasOwn(ENDINGS, state)) {
      this._finish(this._row(state, entry));
    } else if (!this.finished.has(entry.id)) {
      this.entries.set(entry.id, { ...this._row(state, entry), pos: this._placeOf(entry.id) });
    }
    if (state === "delivering") this.leaseSince = Date.now();
    else if (![...this.entries.values()].some((r) => r.state === "delivering")) {
      this.leaseSince = null;
    }
  }

  /** A row's place in the queue: where it stood, or after every other row (a new one). */
  _placeOf(id) {
    const known = this.entries.get(id);
    if (known && known.pos !== undefined) return known.pos;
    let last = -1;
    for (const row of this.entries.values()) last = Math.max(last, row.pos ?? -1);
    return last + 1;
  }

  /** A 202's entry, in case its queue.update has not arrived yet. */
  _adopt(entry) {
    if (this.entries.has(entry.id) || this.finished.has(entry.id)) return;
    // The state it was stored in: "parked" in a parked workspace, else "queued".
    this.entries.set(entry.id, { ...this._row(stateOf(entry), entry), pos: this._placeOf(entry.id) });
    this._render();
  }

  _localChanged() {
    this._render();
  }

  _render() {
    if (this.closed) return;
    const live = [...this.entries.values()].sort(inQueueOrder).map((row) => {
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
      hold: this.ctx.hold(),
      entries: [...done, ...live],
      pending: this.ctx.pending(),
      worker: this.worker,
    };
    try {
      this.onChange(view);
    } catch (err) {
      console.error("outbox: onChange failed", err);
    }
  }
}
