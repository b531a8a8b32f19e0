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
  finished: "ended",
  expired: "expired",
  sending: "sending",
  retrying: "resending",
  held: "held",
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
  stop: () => subscription.stop(),
  "send now": (id) => subscription.sendNow(id),
};

async function act(what, id) {
  try {
    await ACTIONS[what](id);
    showError("");
  } catch (err) {
    const why = err.status === 409 && err.code === "busy" ? "busy: it is being delivered or verified right now" : err.detail || err.message;
    showError(`Could not ${what}: ${why}`);
  }
}

function entryDetails(row, now) {
  const e = row.entry;
  const bits = [];
  if (row.blockedByInFlight) {
    bits.push(`blocked behind an in-flight message for ${seconds(now - row.inFlightSince)} s`);
  } else if (row.behind) {
    bits.push("waits for the message before it (strict FIFO)");
  }
  if (e.interrupted) bits.push(row.state === "sent" ? "its turn was cut (Stop)" : "stopping: its turn is being cut");
  if (e.attempts) bits.push(`failed attempts: ${e.attempts}`);
  if (e.verifyAttempts) bits.push(`verification passes: ${e.verifyAttempts}`);
  if (e.nextAttemptAt && (row.state === "pending" || row.state === "verifying")) {
    const due = Date.parse(e.nextAttemptAt) - now;
    const what = row.state === "verifying" ? "next check" : "next try";
    if (due > 0) bits.push(`${what} in ${seconds(due)} s`);
  }
  if (e.reason && (row.state === "error" || row.state === "parked")) bits.push(`reason: ${e.reason}`);
  if (e.lastError && row.state !== "sent") bits.push(`last error: ${e.lastError}`);
  if (row.state === "finished") bits.push("ended while this page was not connected: delivered or dismissed");
  else if (row.ended && row.ended !== "delivered") bits.push("not delivered to the agent");
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
  if (live && row.state === "queued") {
    buttons.append(el("button", { type: "button", class: "send-now", title: "Send this next and cut the running turn", onclick: () => act("send now", row.id) }, "Send now"));
  }
  if (live && ["error", "pending", "verifying"].includes(row.state)) {
    buttons.append(el("button", { type: "button", class: "retry", onclick: () => act("retry", row.id) }, "Retry"));
  }
  if (live && row.state !== "delivering") {
    buttons.append(el("button", { type: "button", class: "dismiss", onclick: () => act("dismiss", row.id) }, "Dismiss"));
  }
  return el(
    "li",
    { class: `entry state-${row.state}`, dataset: { id: row.id, state: row.state, ended: row.ended || "", blocked: row.blockedByInFlight ? "1" : "0" } },
    el("div", { class: "text" }, row.text),
    el("div", { class: "meta" },
      el("span", { class: `badge state-${state}` }, row.blockedByInFlight ? "blocked" : LABELS[row.state] || row.state),
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
  const rows = [...entries.map((r) => renderEntry(r, now)), ...view.pending.map((p) => renderPending(p, now))];
  list.replaceChildren(...rows);
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
      try {
        await postJSON(page.agentURL, { rules: [rule] });
        note.textContent = `Armed: the next prompt will be “${button.textContent}”.`;
      } catch (err) {
        note.textContent = err.message;
      }
    });
  }
}
