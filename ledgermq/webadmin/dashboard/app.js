// LedgerMQ dashboard: plain JavaScript, no build step. Every page polls the
// admin API of the server that served it (relative URLs, so the same files work
// on the NameServer's app and on a broker's) once a second and re-renders; the
// charts keep the last HISTORY samples in memory. When the server has
// authentication on, a 401 shows a sign-in form: the access key and secret
// stay in this tab's sessionStorage and every request is signed in the page
// (sign.js); the secret is never sent.
"use strict";

const API = "api/v1";
const HISTORY = 120;
const series = new Map();   // chart key -> [[time_ms, value], ...]
let timer = null;


function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

class AuthRequired extends Error {}

function credentials() {
  const accessKey = sessionStorage.getItem("lmq.accessKey");
  const secret = sessionStorage.getItem("lmq.secret");
  return accessKey && secret ? { accessKey, secret } : null;
}

async function request(path) {
  // One signed (when signed in) GET: the status and the JSON body, errors included.
  const url = new URL(`${API}/${path}`, location.href).href;
  const headers = {};
  const creds = credentials();
  if (creds) {
    headers.Authorization = await lmqAuthorization(creds.accessKey, creds.secret, "GET", url,
      null);
  }
  const resp = await fetch(url, { cache: "no-store", headers });
  return { resp, body: await resp.json() };
}

async function get(path) {
  const { resp, body } = await request(path);
  if (!resp.ok) {
    const err = body.error || {};
    const message = `${resp.status} ${err.code || ""}: ${err.message || ""}`;
    if (resp.status === 401) throw new AuthRequired(message);
    throw new Error(message);
  }
  return body;
}

function loginForm(message) {
  const signing = window.isSecureContext && window.crypto && crypto.subtle;
  return `<div class="card" id="login"><h2>Sign in</h2>
    <p class="muted">This server requires signed requests. Your access key and secret stay in
      this browser tab (sessionStorage); only signatures are sent.</p>
    ${signing ? "" : `<p class="error">Signing needs a secure page: open the dashboard over
      HTTPS (tls_cert_file) or on localhost.</p>`}
    <form id="login-form"><input name="access_key" placeholder="access key" autocomplete="username">
      <input name="secret" type="password" placeholder="secret" autocomplete="current-password">
      <button>sign in</button></form>
    ${message ? `<p class="error" id="login-error">${esc(message)}</p>` : ""}</div>`;
}

function showUser() {
  const creds = credentials();
  const user = document.getElementById("user");
  if (!user) return;
  user.innerHTML = creds ? `signed in as <b>${esc(creds.accessKey)}</b> ·
    <a href="#" id="logout">sign out</a>` : "";
  const logout = document.getElementById("logout");
  if (logout) logout.onclick = (e) => { e.preventDefault();
    sessionStorage.removeItem("lmq.accessKey"); sessionStorage.removeItem("lmq.secret");
    render(); };
}

function record(key, value) {
  const points = series.get(key) || [];
  points.push([Date.now(), value]);
  while (points.length > HISTORY) points.shift();
  series.set(key, points);
  return points;
}

function chart(key, label, rate) {
  // rate: plot the per-second difference of a counter instead of its value.
  let points = series.get(key) || [];
  if (rate) {
    const out = [];
    for (let i = 1; i < points.length; i++) {
      const dt = (points[i][0] - points[i - 1][0]) / 1000;
      out.push([points[i][0], dt > 0 ? Math.max(0, (points[i][1] - points[i - 1][1]) / dt) : 0]);
    }
    points = out;
  }
  const w = 600, h = 180, pad = 34;
  if (points.length < 2) {
    return `<svg class="chart" viewBox="0 0 ${w} ${h}"><text x="${pad}" y="20">${esc(label)}:` +
      ` collecting…</text></svg>`;
  }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const vmax = Math.max(1, ...points.map((p) => p[1]));
  const xy = points.map(([t, v]) => {
    const x = pad + (w - 2 * pad) * (t1 > t0 ? (t - t0) / (t1 - t0) : 0);
    const y = h - pad + 10 - (h - 2 * pad) * (v / vmax);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  }).join(" ");
  const last = points[points.length - 1][1];
  return `<svg class="chart" viewBox="0 0 ${w} ${h}" data-chart="${esc(key)}">
    <text x="${pad}" y="14">${esc(label)} — now ${Math.round(last)} (max ${Math.round(vmax)})</text>
    <text x="4" y="${pad + 4}">${Math.round(vmax)}</text><text x="4" y="${h - pad + 10}">0</text>
    <text x="${w - pad - 60}" y="${h - 4}">last ${Math.round((t1 - t0) / 1000)} s</text>
    <polyline points="${xy}"/></svg>`;
}

function roleBadge(node) {
  const role = node.reachable ? (node.role || "?") : "unreachable";
  const ready = node.role === "leader" && node.leader_ready === false ? " (not ready)" : "";
  return `<span class="badge role-${esc(role)}">${esc(role)}${ready}</span>`;
}

// ------------------------------------------------------------------ pages

// The nightly audit's latest verdict (GET api/v1/audit, NameServer only):
// passed, failed, stale, unreadable, or none yet (404 NO_AUDIT).
async function auditBanner() {
  const { resp, body } = await request("audit");
  if (resp.status === 401) throw new AuthRequired(body.error ? body.error.message : "");
  if (resp.status === 404) {
    const why = body.error ? body.error.message : "";
    return `<div class="card audit audit-none" id="audit" data-state="none">
      <b class="audit-verdict">No audit yet</b> <span class="muted">${esc(why)}</span></div>`;
  }
  if (!resp.ok) {
    const err = body.error || {};
    return `<div class="card audit audit-unreadable" id="audit" data-state="error">audit verdict:
      ${esc(resp.status)} ${esc(err.code)}: ${esc(err.message)}</div>`;
  }
  const link = body.report ? ` · <a id="audit-report" href="reports/${body.report.split("/")
    .map(encodeURIComponent).join("/")}">nightly report</a>` : "";
  if (body.state === "unreadable") {
    return `<div class="card audit audit-unreadable" id="audit" data-state="unreadable">
      <b class="audit-verdict">Audit verdict unreadable</b>:
      <span id="audit-problem">${esc(body.problem)}</span>${link}</div>`;
  }
  const v = body.verdict;
  const word = { passed: "PASSED", failed: v.exit === 2 ? "FAILED (inputs unreadable)" :
    "FAILED", stale: "STALE" }[body.state];
  const finished = v.finished * 1000;
  const stale = body.state === "stale" ? ` — it passed, but that was more than
    ${esc(Math.round(body.stale_after_s / 3600 * 10) / 10)} h ago: is the nightly audit
    still running?` : "";
  const groups = Object.entries(v.groups).map(([name, g]) =>
    `<span data-audit-group="${esc(name)}">${esc(name)} (cut ${esc(g.cut)}, verified through
      ${esc(g.verified_through)}${g.violations ? `, <b>${esc(g.violations)} violation(s)</b>`
      : ""})</span>`).join(", ");
  const kinds = Object.entries(v.findings).filter(([, n]) => n);
  const findings = kinds.length ? kinds.map(([k, n]) =>
    `<span class="badge role-unreachable" data-kind="${esc(k)}">${esc(k)} ${esc(n)}</span>`)
    .join(" ") : "no violation";
  const took = v.duration_s < 10 ? v.duration_s.toFixed(2) : Math.round(v.duration_s);
  const since = body.state !== "passed" && body.last_success ?
    `; last passed ${when(body.last_success * 1000, Date.now())}` : "";
  return `<div class="card audit audit-${esc(body.state)}" id="audit"
      data-state="${esc(body.state)}" data-night="${esc(v.night)}">
    <b class="audit-verdict">Audit ${word}</b> night <code>${esc(v.night)}</code>, finished
      ${when(finished, Date.now())}${stale}<br>
    groups: ${groups || "none"} · findings: <span id="audit-findings">${findings}</span> ·
    ${esc(v.entries_audited.toLocaleString())} entries (${size(v.bytes_audited)}) audited in
    ${esc(took)} s${since}${link}</div>`;
}

const pages = {
  async overview() {
    const data = await get("cluster");
    document.getElementById("source").textContent = `source: ${data.source}`;
    const audit = data.source === "namesrv" ? await auditBanner() : "";
    const groups = Object.entries(data.groups);
    if (!groups.length) return `${audit}<p>No broker group is registered.</p>`;
    let nodes = 0, leaders = 0, html = "";
    for (const [name, g] of groups) {
      nodes += g.nodes.length;
      leaders += g.nodes.filter((n) => n.reachable && n.role === "leader").length;
      const leader = g.nodes.find((n) => n.node_id === g.leader);
      const rows = g.nodes.map((n) => {
        const f = leader && leader.followers ? leader.followers[String(n.node_id).replace(/^n/, "")]
          : null;
        return `<tr data-node="${esc(n.node_id)}" data-role="${esc(n.reachable ? n.role :
          "unreachable")}">
          <td>${esc(n.node_id)}</td><td>${esc(n.address)}</td><td>${roleBadge(n)}</td>
          <td>${esc(n.term)}</td><td>${esc(n.last_index)}</td><td>${esc(n.commit_index)}</td>
          <td>${esc(n.applied_index)}</td>
          <td class="${n.lag > 100 ? "lag-high" : ""}">${esc(n.lag)}</td>
          <td>${f ? esc(f.match) : ""}</td><td>${f ? esc(f.lag) : ""}</td>
          <td>${n.admin_url ? `<a href="${esc(n.admin_url)}/">${esc(n.admin_url)}</a>` : ""}</td>
        </tr>`;
      }).join("");
      const commit = Math.max(0, ...g.nodes.map((n) => n.commit_index || 0));
      record(`commit:${name}`, commit);
      html += `<div class="card" data-group="${esc(name)}">
        <h2>group ${esc(name)} — leader <span class="leader-id">${esc(g.leader ?? "none")}</span>,
          term <span class="term">${esc(g.term)}</span></h2>
        <table><thead><tr><th>node</th><th>address</th><th>role</th><th>term</th><th>last</th>
          <th>commit</th><th>applied</th><th>lag</th><th>match (leader view)</th>
          <th>follower lag</th><th>admin</th></tr></thead><tbody>${rows}</tbody></table>
        ${chart(`commit:${name}`, "entries committed per second", true)}
      </div>`;
    }
    return `${audit}<div class="summary" id="summary">${groups.length} group(s), ${nodes} nodes,
      ${leaders} leader(s)</div>${html}`;
  },

  async topics() {
    const data = await get("topics");
    const rows = data.topics.map((t) => `<tr><td><a href="#/topic/${encodeURIComponent(t.topic)}">
      ${esc(t.topic)}</a></td><td>${esc(t.group)}</td><td>${esc(t.queues)}</td>
      <td>${esc(t.perm)}</td><td>${esc(t.messages)}</td></tr>`).join("");
    return `<div class="card"><h2>Topics</h2><table><thead><tr><th>topic</th><th>group</th>
      <th>queues</th><th>perm</th><th>messages</th></tr></thead><tbody>${rows ||
      "<tr><td colspan=5>none</td></tr>"}</tbody></table></div>`;
  },

  async topic(name) {
    const data = await get(`topics/${encodeURIComponent(name)}`);
    // A broker answers with one group's view, the NameServer with every group's.
    const groups = data.groups || { [data.group]: data };
    const total = Object.values(groups).reduce((s, g) => s + g.queue_offsets.reduce(
      (a, q) => a + q.max_offset, 0), 0);
    record(`topic:${name}`, total);
    let html = `<div class="card"><h2>Topic ${esc(name)}</h2>
      ${chart(`topic:${name}`, "messages stored per second", true)}</div>`;
    for (const [group, g] of Object.entries(groups)) {
      const rows = g.queue_offsets.map((q) => `<tr><td>${q.queue_id}</td><td>${q.min_offset}</td>
        <td>${q.max_offset}</td></tr>`).join("");
      html += `<div class="card"><h2>group ${esc(group)}: ${g.queues} queues, perm ${g.perm}</h2>
        <table><thead><tr><th>queue</th><th>min offset</th><th>max offset</th></tr></thead>
        <tbody>${rows}</tbody></table></div>`;
    }
    return html;
  },

  async groups() {
    const data = await get("consumer-groups");
    const rows = data.consumer_groups.map((g) => {
      record(`lag:${g.group}`, g.lag);
      return `<tr><td><a href="#/group/${encodeURIComponent(g.group)}">${esc(g.group)}</a></td>
        <td>${esc(g.topics.join(", "))}</td><td>${esc(g.members)}</td>
        <td class="${g.lag > 1000 ? "lag-high" : ""}">${esc(g.lag)}</td></tr>`;
    }).join("");
    return `<div class="card"><h2>Consumer groups</h2><table><thead><tr><th>group</th>
      <th>topics</th><th>members</th><th>lag</th></tr></thead><tbody>${rows ||
      "<tr><td colspan=4>none</td></tr>"}</tbody></table></div>`;
  },

  async group(name) {
    const data = await get(`consumer-groups/${encodeURIComponent(name)}`);
    record(`lag:${name}`, data.lag);
    let html = `<div class="card"><h2>Consumer group ${esc(name)} — lag
      <span id="group-lag">${esc(data.lag)}</span></h2>
      ${chart(`lag:${name}`, "messages behind", false)}
      <p class="muted">members: ${data.members.map((m) => esc(m.client_id)).join(", ") ||
      "none online"}</p></div>`;
    for (const [topic, queues] of Object.entries(data.topics)) {
      const rows = queues.map((q) => `<tr><td>${esc(q.broker_group)}</td><td>${q.queue_id}</td>
        <td>${q.offset}</td><td>${q.max_offset}</td><td>${q.lag}</td></tr>`).join("");
      html += `<div class="card"><h2>${esc(topic)}</h2><table><thead><tr><th>broker group</th>
        <th>queue</th><th>committed</th><th>max offset</th><th>lag</th></tr></thead>
        <tbody>${rows}</tbody></table></div>`;
    }
    return html;
  },

  async messages(query) {
    const params = new URLSearchParams(query || "");
    const form = `<div class="card"><h2>Message lookup</h2>
      <form id="by-id"><input name="id" size="40" placeholder="broker-a@0000000000001F40"
        value="${esc(params.get("id") || "")}"><button>by id</button></form>
      <form id="by-key"><input name="topic" placeholder="topic" value="${esc(params.get("topic")
        || "")}"><input name="key" placeholder="key" value="${esc(params.get("key") || "")}">
        <button>by key</button></form><div id="lookup-result">`;
    let result = "";
    try {
      if (params.get("id")) {
        result = renderMessages([await get(`messages/${encodeURIComponent(params.get("id"))}`)]);
      } else if (params.get("topic") && params.get("key")) {
        const found = await get(`messages?topic=${encodeURIComponent(params.get("topic"))}` +
          `&key=${encodeURIComponent(params.get("key"))}`);
        result = `<p class="muted">scanned ${found.scanned} messages` +
          `${found.complete ? "" : " (stopped early)"}</p>` + renderMessages(found.messages);
      }
    } catch (err) {
      result = `<p class="error">${esc(err.message)}</p>`;
    }
    return form + result + "</div></div>";
  },

  async retention() {
    const data = await get("retention");
    // The NameServer lists every node of every group; a broker answers for itself.
    const groups = data.groups || { [data.group]: { nodes: [data] } };
    const now = Date.now();
    let html = "";
    for (const [name, g] of Object.entries(groups)) {
      let settings = null;
      const rows = g.nodes.map((n) => {
        if (n.error) {
          return `<tr data-node="${esc(n.node_id)}"><td>${esc(n.node_id)}</td>
            <td colspan=9 class="error">${esc(n.error.code)}: ${esc(n.error.message)}</td></tr>`;
        }
        settings = settings || n.settings;
        const d = n.disk, r = n.retained, snap = n.snapshot;
        const pct = Math.round(d.usage_ratio * 1000) / 10;
        record(`disk:${name}:${n.node_id}`, pct);
        const level = d.usage_ratio > n.settings.disk_hard_ratio ? "lag-high" :
          d.usage_ratio > n.settings.disk_soft_ratio ? "warn" : "";
        return `<tr data-node="${esc(n.node_id)}" data-first-index="${esc(r.first_index)}"
          data-refusing="${d.refusing_writes ? 1 : 0}">
          <td>${esc(n.node_id)}</td><td>${esc(n.role)}</td>
          <td class="${level}">${pct}% of ${size(d.total_bytes)}</td>
          <td>${size(d.log_bytes)} (${esc(d.segments)} seg)</td>
          <td>${esc(r.first_index)}</td><td>${esc(r.last_index)}</td>
          <td>${when(r.first_time_ms, now)}</td><td>${when(r.last_time_ms, now)}</td>
          <td>${snap ? esc(snap.index) : "none"}</td>
          <td>${d.refusing_writes ? '<span class="badge role-unreachable">DISK_FULL</span>' :
            "ok"}</td></tr>`;
      }).join("");
      const s = settings ? `retention ${esc(settings.retention_hours)} h,
        ${settings.retention_bytes ? size(settings.retention_bytes) : "no size limit"},
        soft ${Math.round(settings.disk_soft_ratio * 100)}%,
        hard ${Math.round(settings.disk_hard_ratio * 100)}%` : "";
      const charts = g.nodes.filter((n) => !n.error).map((n) =>
        chart(`disk:${name}:${n.node_id}`, `${n.node_id} disk used %`, false)).join("");
      const agreed = Math.max(0, ...g.nodes.filter((n) => !n.error).map(
        (n) => n.trim.agreed_position));
      html += `<div class="card" data-retention-group="${esc(name)}">
        <h2>group ${esc(name)} — retention</h2><p class="muted">${s}; agreed trim point:
          position ${esc(agreed)}</p>
        <table><thead><tr><th>node</th><th>role</th><th>disk</th><th>log</th>
          <th>first index</th><th>last index</th><th>oldest message</th>
          <th>newest message</th><th>snapshot</th><th>writes</th></tr></thead>
        <tbody>${rows}</tbody></table><div class="grid">${charts}</div></div>`;
    }
    return html || "<p>No broker group is registered.</p>";
  },

  async members() {
    const data = await get("members");
    // The NameServer answers per group (from each leader); a broker for its own.
    const groups = data.groups || { [data.group]: data };
    let html = "";
    for (const [name, g] of Object.entries(groups)) {
      if (g.error) {
        html += `<div class="card"><h2>group ${esc(name)} — members</h2>
          <p class="error">${esc(g.error.code)}: ${esc(g.error.message)}</p></div>`;
        continue;
      }
      const rows = g.members.map((m) => {
        const mismatch = m.identity_mismatch ? `<span class="badge role-unreachable"
          title="the node answers from directory ${esc(m.heard_directory_hex)}">wiped? rejoin
          </span>` : "";
        return `<tr data-member="${esc(m.node_id)}" data-role="${esc(m.role)}"
          data-mismatch="${m.identity_mismatch ? 1 : 0}">
          <td>n${esc(m.node_id)}${m.leader ? ' <span class="badge role-leader">leader</span>' : ""}
          </td><td>${esc(m.role)}</td><td>${esc(m.address)}</td><td><code>${esc(m.directory_hex)}</code></td>
          <td>${esc(m.match ?? "")}</td><td>${esc(m.lag ?? "")}</td><td>${esc(m.state ?? "")}</td>
          <td>${mismatch}</td></tr>`;
      }).join("");
      html += `<div class="card" data-members-group="${esc(name)}">
        <h2>group ${esc(name)} — members</h2><p class="muted">configuration at index
          ${esc(g.membership_index)}${g.membership_pending ? " (not committed yet)" : ""};
          ${esc(g.voters.length)} voter(s), ${esc(g.learners.length)} learner(s); tolerates
          ${esc(g.fault_tolerance)} failed voter(s). Change it with
          <code>ledgermq member add|remove|replace|promote|rejoin</code>.</p>
        <table><thead><tr><th>node</th><th>role</th><th>address</th><th>directory</th>
          <th>match</th><th>lag</th><th>replication</th><th>identity</th></tr></thead>
        <tbody>${rows}</tbody></table></div>`;
    }
    return html || "<p>No broker group is registered.</p>";
  },

  async reports() {
    const data = await get("reports");
    if (!data.directory) return `<div class="card"><h2>Reports</h2><p>No reports directory is
      configured (<code>reports_dir</code> / <code>--reports-dir</code>).</p></div>`;
    const rows = data.reports.map((r) => `<tr><td><a href="reports/${esc(r.path)}">${esc(r.name)}
      </a></td><td>${esc(r.kind)}</td><td>${new Date(r.modified_ms).toLocaleString()}</td>
      <td>${esc(r.summary ? JSON.stringify(r.summary) : "")}</td></tr>`).join("");
    return `<div class="card"><h2>Reports in ${esc(data.directory)}</h2><table><thead><tr>
      <th>report</th><th>kind</th><th>modified</th><th>summary</th></tr></thead>
      <tbody>${rows || "<tr><td colspan=4>none</td></tr>"}</tbody></table></div>`;
  },
};

function size(n) {
  if (n == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

function when(ms, now) {
  // How long ago, in the largest unit that fits; the exact time on hover.
  if (ms == null) return "-";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  const ago = s >= 86400 ? `${Math.floor(s / 86400)} d` : s >= 3600 ?
    `${Math.floor(s / 3600)} h` : s >= 60 ? `${Math.floor(s / 60)} min` : `${s} s`;
  return `<span title="${esc(new Date(ms).toISOString())}">${ago} ago</span>`;
}

function renderMessages(list) {
  if (!list.length) return "<p>No message found.</p>";
  return list.map((m) => `<div class="card message"><h2>${esc(m.msg_id)}</h2>
    <p>topic <b>${esc(m.topic)}</b> queue ${m.queue_id} offset ${esc(m.queue_offset)} ·
    tags ${esc(m.tags)} · keys ${esc(m.keys)} · stored
    ${new Date(m.store_timestamp_ms).toISOString()}</p>
    <pre>${esc(m.body_text ?? `(binary, ${m.body_size} bytes) ${m.body_base64}`)}</pre></div>`)
    .join("");
}

// ----------------------------------------------------------------- router

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  const [name, arg] = path.split("/");
  const known = { "": "overview", topics: "topics", topic: "topic", groups: "groups",
    group: "group", messages: "messages", reports: "reports", retention: "retention",
    members: "members" };
  const key = known[name] || "overview";
  return { key, arg: arg ? decodeURIComponent(arg) : query, live: key !== "messages" &&
    key !== "reports" };
}

async function render() {
  const { key, arg, live } = route();
  const nav = { topic: "topics", group: "groups" }[key] || key;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === nav);
  }
  const main = document.getElementById("main");
  clearTimeout(timer);
  showUser();
  try {
    const html = await pages[key](arg);
    if (route().key === key) main.innerHTML = html;
    document.getElementById("updated").textContent =
      `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (err instanceof AuthRequired) {
      // Stop polling until someone signs in: a wrong key must not be retried.
      main.innerHTML = loginForm(credentials() ? err.message : "");
      bindLogin();
      return;
    }
    main.innerHTML = `<p class="error">${esc(err.message)}</p>`;
  }
  bindForms();
  if (live) timer = setTimeout(render, 1000);
}

function bindLogin() {
  const form = document.getElementById("login-form");
  if (!form) return;
  form.onsubmit = (e) => {
    e.preventDefault();
    sessionStorage.setItem("lmq.accessKey", form.elements.access_key.value.trim());
    sessionStorage.setItem("lmq.secret", form.elements.secret.value.trim());
    render();
  };
}

function bindForms() {
  const byId = document.getElementById("by-id");
  if (byId) byId.onsubmit = (e) => { e.preventDefault();
    location.hash = `#/messages?id=${encodeURIComponent(byId.elements.id.value.trim())}`; };
  const byKey = document.getElementById("by-key");
  if (byKey) byKey.onsubmit = (e) => { e.preventDefault();
    location.hash = `#/messages?topic=${encodeURIComponent(byKey.elements.topic.value.trim())}` +
      `&key=${encodeURIComponent(byKey.elements.key.value.trim())}`; };
}

window.addEventListener("hashchange", render);
render();
