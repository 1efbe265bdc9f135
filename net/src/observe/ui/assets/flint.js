// Flint's pages, served by Flint itself (no CDN, no build). Three jobs:
// - the login: the token from the address's #token= fragment (never sent to a server, never in a
//   Referer) or the form, sent once in a POST body; the server answers with a cookie, so no
//   address ever holds the token;
// - the live parts: every REFRESH_MS the page is fetched again and its parts marked data-live
//   are swapped in (the tables stay rendered in one place, the server);
// - the pictures, drawn as SVG from the JSON API: the charts from /api/v1/series, the task
//   timeline from /api/v1/timeline. Every drawn element carries data- attributes for tests.
"use strict";

(function () {
  const REFRESH_MS = 2000;
  const NS = "http://www.w3.org/2000/svg";
  const TIMELINE_SPAN_US = 30e6;
  const COLORS = {
    SUCCEEDED: "#2da44e",
    FAILED: "#cf222e",
    KILLED: "#8c959f",
    LOST: "#fb8500",
    RUNNING: "#0969da",
  };

  function login(form) {
    form.next.value = location.pathname + location.search;
    const match = location.hash.match(/[#&]token=([^&]*)/);
    if (!match) {
      return;
    }
    // Out of the address bar and the history before anything else.
    history.replaceState(null, "", location.pathname + location.search);
    const body = new URLSearchParams({ token: decodeURIComponent(match[1]), next: form.next.value });
    fetch("/login", { method: "POST", body: body, credentials: "same-origin" }).then((r) => {
      if (r.ok && r.redirected) {
        location.replace(form.next.value);
      } else {
        document.getElementById("login-error").textContent = "That token was refused.";
      }
    });
  }

  function getJson(path) {
    return fetch(path, { credentials: "same-origin" }).then((r) =>
      r.ok ? r.json() : Promise.reject(r.status)
    );
  }

  // Swaps the parts of the page marked data-live for the same parts of a fresh copy.
  function refreshParts() {
    return fetch(location.pathname + location.search, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        for (const part of document.querySelectorAll("[data-live]")) {
          const next = fresh.getElementById(part.id);
          if (next) {
            part.replaceWith(document.importNode(next, true));
          }
        }
        const stamp = document.getElementById("updated");
        if (stamp) {
          stamp.textContent = new Date().toLocaleTimeString();
        }
      })
      .catch(() => {});
  }

  function add(parent, name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) {
      node.setAttribute(k, v);
    }
    if (text !== undefined) {
      node.textContent = text;
    }
    parent.appendChild(node);
    return node;
  }

  // ----- charts -----

  // One row per interval between points: rates per second, gauges, latencies in ms.
  function rows(points) {
    const out = [];
    for (let i = 1; i < points.length; i++) {
      const a = points[i - 1];
      const b = points[i];
      const dt = (b.t_us - a.t_us) / 1e6;
      if (dt <= 0) {
        continue;
      }
      const ms = (s, k) => (s ? s[k] / 1e3 : null);
      out.push({
        t: b.t_us / 1e6,
        succeeded: (b.succeeded - a.succeeded) / dt,
        launched: (b.launched - a.launched) / dt,
        failed: (b.attempts_failed - a.attempts_failed) / dt,
        copies: (b.copies - a.copies) / dt,
        kills: (b.kills_sent - a.kills_sent) / dt,
        running: b.running,
        pending: b.pending,
        p50: ms(b.job_latency, "p50_us"),
        p99: ms(b.job_latency, "p99_us"),
        taskP50: ms(b.round_trip, "p50_us"),
        taskP99: ms(b.round_trip, "p99_us"),
      });
    }
    return out;
  }

  function short(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (v >= 10 || v === 0) return v.toFixed(0);
    return v.toPrecision(2);
  }

  // A line chart of `lines` ({key, name, color}) over `data` in the svg (viewBox 420 x 170).
  function lineChart(svg, data, lines, log) {
    svg.replaceChildren();
    const [left, right, top, bottom] = [46, 412, 22, 146];
    const now = data.length ? data[data.length - 1].t : 0;
    const span = Math.min(300, Math.max(60, data.length ? now - data[0].t : 60));
    const values = data.flatMap((d) => lines.map((l) => d[l.key])).filter((v) => v !== null && v > 0);
    let lo = 0;
    let hi = Math.max(1, ...values) * 1.1;
    if (log) {
      lo = Math.pow(10, Math.floor(Math.log10(Math.min(...values, hi / 10))));
      hi = Math.pow(10, Math.ceil(Math.log10(hi)));
    }
    const y = (v) => {
      const f = log ? Math.log10(v / lo) / Math.log10(hi / lo) : (v - lo) / (hi - lo);
      return bottom - f * (bottom - top);
    };
    const x = (t) => right - ((now - t) / span) * (right - left);
    for (let i = 0; i <= 4; i++) {
      const v = log ? lo * Math.pow(hi / lo, i / 4) : lo + ((hi - lo) * i) / 4;
      add(svg, "line", { x1: left, x2: right, y1: y(v), y2: y(v), class: "grid" });
      add(svg, "text", { x: left - 4, y: y(v) + 4, class: "tick", "text-anchor": "end" }, short(v));
    }
    for (let s = 0; s <= span; s += span / 5) {
      const label = s === 0 ? "now" : "-" + Math.round(s) + "s";
      add(svg, "text", { x: x(now - s), y: bottom + 14, class: "tick", "text-anchor": "middle" }, label);
    }
    lines.forEach((l, i) => {
      const pts = data.filter((d) => d[l.key] !== null && (!log || d[l.key] > 0) && now - d.t <= span);
      const d = pts.map((p, j) => (j ? "L" : "M") + x(p.t).toFixed(1) + "," + y(p[l.key]).toFixed(1)).join("");
      const last = pts.length ? pts[pts.length - 1][l.key] : 0;
      add(svg, "path", { d: d, stroke: l.color, class: "line", "data-series": l.key, "data-last": last });
      const step = (right - left) / lines.length;
      add(svg, "text", { x: left + 4 + i * step, y: 12, fill: l.color, class: "legend" }, l.name + " " + short(last));
    });
    svg.setAttribute("data-points", data.length);
  }

  function drawCharts(series) {
    const data = rows(series.points);
    const chart = (id, lines, log) => {
      const svg = document.getElementById(id);
      if (svg) {
        lineChart(svg, data, lines, log);
      }
    };
    chart("chart-throughput", [
      { key: "succeeded", name: "succeeded/s", color: "#2da44e" },
      { key: "launched", name: "launched/s", color: "#0969da" },
    ]);
    chart("chart-load", [
      { key: "running", name: "running", color: "#0969da" },
      { key: "pending", name: "pending", color: "#9a6700" },
    ]);
    chart("chart-latency", [
      { key: "p50", name: "job p50", color: "#0969da" },
      { key: "p99", name: "job p99", color: "#cf222e" },
      { key: "taskP50", name: "task p50", color: "#54aeff" },
      { key: "taskP99", name: "task p99", color: "#ff8182" },
    ], true);
    chart("chart-failures", [
      { key: "failed", name: "failed/s", color: "#cf222e" },
      { key: "copies", name: "copied/s", color: "#8250df" },
      { key: "kills", name: "kills/s", color: "#8c959f" },
    ]);
  }

  // ----- timeline -----

  // Places each bar of a lane in the first of its rows free when the bar starts (a task
  // stream), at most ROWS_MAX rows a lane; gives each bar its row and each lane its rows.
  const ROWS_MAX = 8;
  function pack(bars, now) {
    const lanes = new Map();
    for (const b of [...bars].sort((p, q) => p.start_us - q.start_us)) {
      const key = b.executor + " lane " + b.lane;
      if (!lanes.has(key)) {
        lanes.set(key, []);
      }
      const ends = lanes.get(key);
      let row = ends.findIndex((end) => end <= b.start_us);
      if (row < 0 && ends.length < ROWS_MAX) {
        row = ends.length;
        ends.push(0);
      } else if (row < 0) {
        row = ends.indexOf(Math.min(...ends));
      }
      ends[row] = b.end_us === null ? now : b.end_us;
      b.key = key;
      b.row = row;
    }
    return lanes;
  }

  function drawTimeline(svg, data) {
    svg.replaceChildren();
    const now = data.now_us;
    const from = now - TIMELINE_SPAN_US;
    const bars = data.bars.filter((b) => b.end_us === null || b.end_us >= from);
    const lanes = pack(bars, now);
    const keys = [...lanes.keys()].sort();
    const [left, right, top, rowH, gap] = [150, 1190, 18, 9, 5];
    const laneTop = new Map();
    let y = top;
    for (const key of keys) {
      laneTop.set(key, y);
      add(svg, "text", { x: 4, y: y + 9, class: "lane" }, key);
      y += lanes.get(key).length * rowH + gap;
    }
    svg.setAttribute("viewBox", "0 0 1200 " + Math.max(y + 4, 40));
    const x = (t) => left + ((Math.max(t, from) - from) / TIMELINE_SPAN_US) * (right - left);
    for (let s = 0; s <= 30; s += 5) {
      const label = s === 30 ? "now" : "-" + (30 - s) + "s";
      add(svg, "text", { x: x(from + s * 1e6), y: 12, class: "tick", "text-anchor": "middle" }, label);
    }
    for (const b of bars) {
      const end = b.end_us === null ? now : b.end_us;
      const by = laneTop.get(b.key) + b.row * rowH;
      const rect = add(svg, "rect", {
        x: x(b.start_us).toFixed(1),
        y: by,
        width: Math.max(1, x(end) - x(b.start_us)).toFixed(1),
        height: rowH - 2,
        fill: COLORS[b.outcome],
        class: "bar" + (b.copy ? " copy" : ""),
        "data-outcome": b.outcome,
        "data-copy": b.copy,
        "data-job": b.job,
        "data-executor": b.executor,
      });
      add(rect, "title", {}, "job " + b.job + " task " + b.task + " attempt " + b.attempt +
        (b.copy ? " (copy)" : "") + ": " + b.outcome + ", " + ((end - b.start_us) / 1e3).toFixed(1) + " ms");
      if (b.kill_us !== null && b.kill_us >= from) {
        const kx = x(b.kill_us);
        add(svg, "path", { d: `M${kx - 3},${by}l6,${rowH - 2}m0,${2 - rowH}l-6,${rowH - 2}`, class: "kill", "data-kill": b.job });
      }
    }
    svg.setAttribute("data-bars", bars.length);
    svg.setAttribute("data-lanes", keys.length);
  }

  function draw() {
    if (document.getElementById("charts")) {
      getJson("/api/v1/series").then(drawCharts).catch(() => {});
    }
    const timeline = document.getElementById("timeline");
    if (timeline) {
      getJson("/api/v1/timeline").then((d) => drawTimeline(timeline, d)).catch(() => {});
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.getElementById("login");
    if (form) {
      login(form);
      return;
    }
    draw();
    setInterval(() => {
      refreshParts();
      draw();
    }, REFRESH_MS);
  });
})();
