// The demo's queue page: django-outbox's outbox.js plus a little DOM. Every piece of user
// or server text goes through textContent (never innerHTML).
import { createOutbox } from "../django_outbox/outbox.js";

const page = JSON.parse(document.getElementById("outbox-page").textContent);
const $ = (id) => document.getElementById(id);

const LABELS = {
  queued: "queued",
  pending: "waiting to retry",
  delivering: "delivering",
  verifying: "verifying",
  sent: "delivered",
  error: "error",
  parked: "parked",
  dismissed: "dismissed",
  cancelled: "cancelled (never sent)",
  expired: "expired (never sent)",
  finished: "ended",
  sending: "sending",
  retrying: "resending",
  held: "held",
};

// A row whose turn a Stop cut (row.stop, outbox.js): stopping, then how it ended; never "failed".
const STOP_LABELS = {
  "stopping delivering": "stopping…",
  "stopping verifying": "stopping…",
  "stopping parked": "stopping…",
  "stopping error": "stopped: staff decide",
  "stopped sent": "interrupted",
  "stopped cancelled": "cancelled (stopped)",
};

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function getCookie(name) {
  const found = document.cookie.split(";").map((c) => c.trim()).find((c) => c.startsWith(name + "="));
  return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
}

/** The CSRF cookie, or the page's {% csrf_token %} input when the cookie is HttpOnly. */
function csrfToken() {
  return getCookie("csrftoken") || document.querySelector("[name=csrfmiddlewaretoken]")?.value || "";
}

async function postJSON(url, body) {
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.detail || `HTTP ${response.status}`);
  return data;
}

const seconds = (ms) => Math.max(0, Math.round(ms / 1000));

// -- sessions ------------------------------------------------------------------------

$("new-session")?.addEventListener("click", async () => {
  try {
    const made = await postJSON(page.sessionsURL, {});
    const url = new URL(location.href);
    url.searchParams.set("workspace", page.workspace);
    url.searchParams.set("session", made.sessionID);
    location.assign(url);
  } catch (err) {
    $("aside-error").hidden = false;
    $("aside-error").textContent = `Could not make a session: ${err.message}`;
  }
});

// -- the queue -------------------------------------------------------------------------

// `user` keeps this user's unsent prompts apart from anyone else's who uses this browser,
// and they are only ever sent while this user is logged in (README "JavaScript client").
const outbox = createOutbox({
  baseURL: page.apiBase,
  user: page.userID,
  onEvent(event) {
    if (event.type === "rejected") {
      showError(`Refused: “${event.item.text.slice(0, 60)}”: ${event.error.detail || event.error.message}`);
    }
  },
});

let lastView = null;

function showError(message) {
  const box = $("queue-error");
  if (!box) return;
  box.hidden = !message;
  box.textContent = message || "";
}

const ACTIONS = {
  retry: (id) => subscription.retry(id),
  dismiss: (id) => subscription.dismiss(id),
  // Stop names the prompt whose button was pressed: if its turn has ended meanwhile, the
  // server cuts nothing (409 not_in_flight) rather than the next prompt's turn.
  stop: (id) => subscription.stop(id),
  "send now": (id) => subscription.sendNow(id),
  // Steering (docs/howto/steering.md): cancel a queued prompt, or cut the one in flight.
  cancel: (id) => subscription.cancel(id),
  move: (id, place) => subscription.move(id, place),
};

async function act(what, id, ...args) {
  try {
    await ACTIONS[what](id, ...args);
    showError("");
  } catch (err) {
    const why =
      err.status === 409 && err.code === "busy"
        ? "busy: it is being delivered or verified right now"
        : err.status === 409 && err.code === "not_in_flight"
          ? "its turn had already ended, so nothing was cut"
          : err.detail || err.message;
    showError(`Could not ${what}: ${why}`);
  }
}

// -- steering: inline edit, and what changed lately ------------------------------------------

// States whose prompt may still be edited (docs/howto/steering.md#edit).
const EDITABLE = ["queued", "pending", "error", "parked", "expired"];
// How long a row says "edited" or "moved" after the change reached this page.
const CHANGE_SHOWN_MS = 8000;
// The prompt being edited: {id, version, node}. Its row keeps its DOM node across renders
// (a fresh node would take the text box, its caret and its focus away mid-typing).
let editing = null;
const changes = new Map(); // id -> {what: "edited" | "moved", until: ms}
let lastTexts = new Map();
let lastOrder = [];

/** Note which rows were edited or moved since the last render (from anyone, any tab). */
function noteChanges(rows, now) {
  for (const r of rows) {
    const before = lastTexts.get(r.id);
    if (before !== undefined && before !== r.text) changes.set(r.id, { what: "edited", until: now + CHANGE_SHOWN_MS });
  }
  // A move: the rows that passed the most others (for one move, the row that was moved).
  const order = rows.map((r) => r.id);
  const kept = new Set(order.filter((id) => lastOrder.includes(id)));
  const current = order.filter((id) => kept.has(id));
  const was = lastOrder.filter((id) => kept.has(id));
  if (current.join("\n") !== was.join("\n")) {
    const rank = new Map(was.map((id, i) => [id, i]));
    const passed = current.map((id, i) => current.filter((other, j) => j !== i && (j < i) !== (rank.get(other) < rank.get(id))).length);
    const most = Math.max(...passed);
    current.forEach((id, i) => passed[i] === most && changes.set(id, { what: "moved", until: now + CHANGE_SHOWN_MS }));
  }
  for (const [id, change] of changes) if (change.until <= now) changes.delete(id);
  lastTexts = new Map(rows.map((r) => [r.id, r.text]));
  lastOrder = order;
}

function startEdit(row) {
  editing = { id: row.id, version: lastView?.version, node: null, text: row.text };
  render(lastView);
  const box = editing?.node?.querySelector("textarea");
  if (box) {
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }
}

function stopEdit() {
  editing = null;
  if (lastView) render(lastView);
}

async function saveEdit() {
  const box = editing?.node?.querySelector("textarea");
  const text = box?.value.trim();
  if (!text) return showError("Could not edit: the text is empty");
  try {
    // If-Match: the queue's version when the edit began (412 if it changed meanwhile).
    await subscription.edit(editing.id, { text }, { version: editing.version });
    showError("");
    stopEdit();
  } catch (err) {
    if (err.status === 412) {
      // Saving again means: yes, this text, on the queue as it is now.
      editing.version = lastView?.version;
      showError("Could not edit: the queue changed since you began; check it and save again.");
    } else {
      const why = err.status === 409 ? "it is being delivered or verified now" : err.detail || err.message;
      showError(`Could not edit: ${why}`);
      stopEdit();
    }
  }
}

/** The row of the prompt being edited: a text box with Save and Discard. */
function editorRow(row) {
  if (editing.node) return editing.node;
  const box = el("textarea", { class: "edit-text", rows: "3", "aria-label": "New text of the prompt" });
  box.value = editing.text;
  box.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) saveEdit();
    else if (event.key === "Escape") stopEdit();
  });
  editing.node = el(
    "li",
    { class: `entry editing state-${row.state}`, dataset: { id: row.id, state: "editing" } },
    box,
    el("div", { class: "meta" },
      el("span", { class: "detail" }, "Editing: Save replaces the text (Ctrl+Enter), Discard keeps it (Esc)."),
      el("span", { class: "actions" },
        el("button", { type: "button", class: "save", onclick: saveEdit }, "Save"),
        el("button", { type: "button", class: "discard", onclick: stopEdit }, "Discard"),
      ),
    ),
  );
  return editing.node;
}

/** Put rows into the list, leaving `keep` (the row being edited) where it is in the DOM. */
function placeRows(list, rows, keep) {
  if (!keep || keep.parentNode !== list || !rows.includes(keep)) {
    list.replaceChildren(...rows);
    return;
  }
  for (const child of [...list.children]) if (child !== keep) child.remove();
  const at = rows.indexOf(keep);
  for (const node of rows.slice(0, at)) list.insertBefore(node, keep);
  list.append(...rows.slice(at + 1));
}

function entryDetails(row, now) {
  const e = row.entry;
  const bits = [];
  if (row.blockedByInFlight) {
    bits.push(`blocked behind an in-flight message for ${seconds(now - row.inFlightSince)} s`);
  } else if (row.behind) {
    bits.push("waits for the message before it (strict FIFO)");
  }
  if (row.stop === "stopping") bits.push("Stopping… its turn is being cut; checking whether the agent got it");
  else if (row.stop === "stopped") bits.push(row.state === "sent" ? "interrupted: the agent got it, its turn was cut (Stop)" : "stopped before the agent got it");
  if (e.attempts) bits.push(`failed attempts: ${e.attempts}`);
  if (e.verifyAttempts) bits.push(`verification passes: ${e.verifyAttempts}`);
  if (e.nextAttemptAt && (row.state === "pending" || row.state === "verifying")) {
    const due = Date.parse(e.nextAttemptAt) - now;
    const what = row.state === "verifying" ? "next check" : "next try";
    if (due > 0) bits.push(`${what} in ${seconds(due)} s`);
  }
  if (e.reason && (row.state === "error" || row.state === "parked")) bits.push(`reason: ${e.reason}`);
  // A Stop's cut is no error of the agent's: the line above says what happened.
  if (e.lastError && row.state !== "sent" && (!row.stop || row.state === "error")) bits.push(`last error: ${e.lastError}`);
  if (row.state === "finished") bits.push("ended while this page was not connected: delivered, dismissed or cancelled");
  else if (row.ended && row.ended !== "delivered") bits.push("not delivered to the agent");
  // Told by the reconnect's snapshot (its record of recent endings): when it ended.
  if (row.endedAt) bits.push(`ended at ${new Date(row.endedAt).toLocaleTimeString()}, while this page was not connected`);
  return bits.join(" · ");
}

function renderEntry(row, now) {
  const live = !["sent", "dismissed", "finished", "cancelled"].includes(row.state);
  const state = row.blockedByInFlight ? "blocked" : row.state;
  const buttons = el("span", { class: "actions" });
  // Cutting the running turn (docs/howto/cutting.md): Stop on the prompt in flight, Send now
  // on a queued one (it becomes next and the running turn is cut).
  if (live && row.state === "delivering" && !row.entry.interrupted) {
    buttons.append(el("button", { type: "button", class: "stop", title: "Cut the agent's running turn", onclick: () => act("stop", row.id) }, "Stop"));
  }
  const waiting = row.state === "queued" || row.state === "pending";
  if (live && waiting) {
    buttons.append(el("button", { type: "button", class: "send-now", title: "Send this next and cut the running turn", onclick: () => act("send now", row.id) }, "Send now"));
  }
  // Reordering (docs/howto/steering.md): ↑ before the previous waiting prompt, ↓ after the next.
  if (live && waiting && row.prev) {
    buttons.append(el("button", { type: "button", class: "move-up", title: "Move before the previous prompt", "aria-label": "Move up", onclick: () => act("move", row.id, { before: row.prev }) }, "↑"));
  }
  if (live && waiting && row.next) {
    const place = row.afterNext ? { before: row.afterNext } : { to: "last" };
    buttons.append(el("button", { type: "button", class: "move-down", title: "Move after the next prompt", "aria-label": "Move down", onclick: () => act("move", row.id, place) }, "↓"));
  }
  if (live && EDITABLE.includes(row.state)) {
    buttons.append(el("button", { type: "button", class: "edit", title: "Change the text before it is sent", onclick: () => startEdit(row) }, "Edit"));
  }
  if (live && ["error", "pending", "verifying", "expired"].includes(row.state)) {
    buttons.append(el("button", { type: "button", class: "retry", onclick: () => act("retry", row.id) }, "Retry"));
  }
  // Cancel: a queued prompt is never sent; the one in flight has its turn cut.
  const inFlight = row.state === "delivering" || row.state === "verifying";
  if (live && (waiting || (inFlight && !row.entry.interrupted))) {
    const title = waiting ? "Remove it: it is never sent" : "Cut its turn: it ends sent (interrupted) or cancelled";
    buttons.append(el("button", { type: "button", class: "cancel", title, onclick: () => act("cancel", row.id) }, "Cancel"));
  }
  if (live && !waiting && row.state !== "delivering") {
    buttons.append(el("button", { type: "button", class: "dismiss", onclick: () => act("dismiss", row.id) }, "Dismiss"));
  }
  const change = changes.get(row.id);
  return el(
    "li",
    { class: `entry state-${row.state}`, dataset: { id: row.id, state: row.state, ended: row.ended || "", blocked: row.blockedByInFlight ? "1" : "0", change: change?.what } },
    el("div", { class: "text" }, row.text),
    el("div", { class: "meta" },
      el("span", { class: `badge state-${state}` }, row.blockedByInFlight ? "blocked" : STOP_LABELS[`${row.stop} ${row.state}`] || LABELS[row.state] || row.state),
      change ? el("span", { class: `badge change change-${change.what}` }, change.what) : null,
      el("span", { class: "detail" }, entryDetails(row, now)),
      buttons,
    ),
  );
}

function renderPending(item, now) {
  const waiting = item.nextAt > now && !item.sending;
  const state = item.held ? "held" : waiting ? "retrying" : "sending";
  const detail = item.held === "login"
    ? "kept in this browser: it is sent when you are logged in again"
    : item.held
      ? `refused (${item.lastError || "403"}); kept in this browser`
      : waiting
        ? `not acknowledged yet (${item.lastError}); resending in ${seconds(item.nextAt - now)} s`
        : item.attempts
          ? `sending again (attempt ${item.attempts + 1})`
          : "sending…";
  return el(
    "li",
    { class: `entry local state-${state}`, dataset: { cmid: item.clientMessageID, state } },
    el("div", { class: "text" }, item.text),
    el("div", { class: "meta" },
      el("span", { class: `badge state-${state}` }, LABELS[state]),
      el("span", { class: "detail" }, detail),
      el("span", { class: "actions" },
        el("button", { type: "button", class: "cancel", onclick: () => outbox.cancel(item.clientMessageID) }, "Cancel"),
      ),
    ),
  );
}

/** Why this page's prompts are not being sent (a login is needed, or a refusal), if so. */
function renderHold(hold) {
  const box = $("queue-hold");
  if (!box) return;
  box.hidden = !hold;
  if (!hold) {
    box.replaceChildren();
    return;
  }
  const here = location.pathname + location.search;
  let action = null;
  if (hold.reason === "forbidden") {
    action = el("button", { type: "button", class: "link", onclick: () => outbox.resume() }, "Try again");
  } else if (["login_changed", "csrf_failed", "csrf_missing"].includes(hold.code)) {
    action = el("button", { type: "button", class: "link", onclick: () => location.reload() }, "Reload the page");
  } else {
    action = el("a", { href: `${box.dataset.loginUrl}?next=${encodeURIComponent(here)}` }, "Log in again");
  }
  box.replaceChildren(el("span", {}, hold.detail + " "), action);
}

/** Say so when no worker is alive: queued prompts would otherwise just wait, unexplained. */
function renderWorker(worker, entries) {
  const box = $("worker-status");
  if (!box) return;
  const down = Boolean(worker) && !worker.alive;
  box.hidden = !down;
  if (!down) {
    box.textContent = "";
    return;
  }
  const waiting = entries.filter((r) => !r.ended && r.state !== "finished").length;
  const since = worker.lastSeen ? ` (last seen ${new Date(worker.lastSeen).toLocaleTimeString()})` : "";
  box.textContent =
    `No worker is running${since}: ${waiting ? `${waiting} prompt(s) wait` : "prompts will wait"} ` +
    "here until one starts (manage.py outbox_worker). Nothing is lost.";
}

let transcriptTimer = null;
let sentSeen = 0;

function render(view) {
  lastView = view;
  const now = Date.now();
  const list = $("queue");
  // The demo runs ORDERING = "strict": nothing passes an earlier message that is backing
  // off or being verified.
  let head = false;
  const entries = view.entries.map((r) => {
    const behind = head && (r.state === "queued" || r.state === "pending");
    if (["pending", "verifying", "delivering"].includes(r.state)) head = true;
    return { ...r, behind };
  });
  // Neighbours for ↑/↓: the waiting prompts in queue order (finished rows are not queued).
  const waiting = entries.filter((r) => r.state === "queued" || r.state === "pending");
  waiting.forEach((r, i) => Object.assign(r, { prev: waiting[i - 1]?.id, next: waiting[i + 1]?.id, afterNext: waiting[i + 2]?.id }));
  const queued = entries.filter((r) => !["sent", "dismissed", "finished", "cancelled"].includes(r.state));
  noteChanges(queued, now);
  const edited = editing && queued.find((r) => r.id === editing.id && EDITABLE.includes(r.state));
  if (editing && !edited) editing = null; // sent, cancelled or being delivered meanwhile
  const rows = [
    ...entries.map((r) => (edited && r.id === edited.id ? editorRow(r) : renderEntry(r, now))),
    ...view.pending.map((p) => renderPending(p, now)),
  ];
  placeRows(list, rows, editing?.node);
  $("queue-empty").hidden = rows.length > 0;
  const badge = $("connection");
  // "other_user": paused until this page's user logs in again (the hold below says so).
  const paused = view.error?.code === "other_user";
  badge.textContent = paused ? "paused" : view.error ? view.error.detail : view.connected ? "live" : "reconnecting…";
  badge.className = `badge ${view.connected ? "live" : "offline"}`;
  if (view.error && !paused) showError(view.error.detail);
  renderHold(view.hold);
  renderWorker(view.worker, view.entries);
  const sent = view.entries.filter((r) => r.state === "sent").length;
  if (sent !== sentSeen) {
    sentSeen = sent;
    clearTimeout(transcriptTimer);
    transcriptTimer = setTimeout(loadTranscript, 300);
  }
}

const subscription = page.session ? outbox.subscribe(page.workspace, page.session, render) : null;
setInterval(() => lastView && render(lastView), 1000); // the "for N s" counters

$("send-form")?.addEventListener("submit", (event) => {
  event.preventDefault();
  const box = $("prompt");
  const text = box.value.trim();
  if (!text) return;
  box.value = "";
  $("send-note").textContent = "";
  outbox
    .send(page.workspace, page.session, text)
    .then((result) => {
      $("send-note").textContent = result.status === "duplicate" ? "already accepted earlier" : "accepted";
    })
    .catch(() => {}); // reported through onEvent ("rejected")
});
$("prompt")?.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    $("send-form").requestSubmit();
  }
});

// -- what the agent received -------------------------------------------------------------

async function loadTranscript() {
  const list = $("transcript");
  if (!list || !page.transcriptURL) return;
  try {
    const response = await fetch(page.transcriptURL, { credentials: "same-origin" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.detail || `HTTP ${response.status}`);
    list.replaceChildren(
      ...data.messages
        .filter((m) => m.role === "user")
        .map((m) => el("li", { dataset: { id: m.id } }, m.texts.join(" ⏎ "), m.texts.length > 1 ? el("b", {}, ` (${m.texts.length} parts!)`) : null)),
    );
  } catch (err) {
    list.replaceChildren(el("li", { class: "error" }, `Could not read the transcript: ${err.message}`));
  }
}
$("refresh-transcript")?.addEventListener("click", loadTranscript);
loadTranscript();

// -- the fake agent's knobs ------------------------------------------------------------------

const panel = $("agent-panel");
if (panel) {
  const note = $("agent-note");
  const latency = $("latency");
  fetch(page.agentURL, { credentials: "same-origin" })
    .then((r) => r.json())
    .then((knobs) => { latency.value = knobs.latency; });
  latency.addEventListener("change", async () => {
    try {
      await postJSON(page.agentURL, { latency: Number(latency.value) });
      note.textContent = `The agent now thinks ${latency.value} s per prompt.`;
    } catch (err) {
      note.textContent = err.message;
    }
  });
  for (const button of panel.querySelectorAll("button[data-rule]")) {
    button.addEventListener("click", async () => {
      // Scoped to this session: a member's rule may only fail their own deliveries.
      const rule = { match: "", action: button.dataset.rule, times: 1, session: page.session };
      if (rule.action === "delay") rule.seconds = 20;
      if (rule.action === "busy") rule.seconds = 5; // the agent's Retry-After
      try {
        await postJSON(page.agentURL, { rules: [rule] });
        note.textContent = `Armed: the next prompt will be “${button.textContent}”.`;
      } catch (err) {
        note.textContent = err.message;
      }
    });
  }
}
