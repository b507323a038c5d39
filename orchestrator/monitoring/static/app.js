/* The orchestrator's status page.
 *
 * Polls the service's JSON API (api/info; api/queue for one page of the jobs, searched and
 * filtered by the service; for the open job api/jobs/<id> and its metrics since the last step
 * seen) and renders it. Every value that came from a job spec or
 * the service (names, queues, notes, reasons, URIs) reaches the page only as a text node or an
 * attribute value: this file never assigns innerHTML, and links are limited to http(s) URLs.
 * Rows and charts are updated in place, so nothing flickers and nothing reloads.
 */
(() => {
  "use strict";

  const POLL_MS = 2000;
  const HIDDEN_POLL_MS = 10000; // a background tab asks less often
  const PAGE_SIZE = 50; // jobs a page of the queue lists: the service pages and searches the rest
  const SEARCH_DELAY_MS = 250; // the search is sent once typing pauses, not at each key
  const CHART_HEIGHT = 210;
  const SMOOTHING = 0.85; // EMA weight of the smoothed loss line
  const STATES = ["running", "admitted", "stopping", "queued", "preempted", "succeeded", "failed", "stopped"];
  const ACTIVE = new Set(["admitted", "running", "stopping"]);
  const PENDING = new Set(["queued", "preempted"]);
  const FINISHED = new Set(["succeeded", "failed", "stopped"]);

  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: text only ------------------------------------------------------------------

  /** An element with attributes and children; strings become text nodes, never markup. */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key.startsWith("on")) throw new Error("event handlers are attached with addEventListener");
      if (key === "class") node.className = value;
      else if (key === "href") {
        const safe = safeHref(value);
        if (safe) node.href = safe;
      } else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child == null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  /** Only http(s) links: a dashboard address like "javascript:..." never becomes a link. */
  function safeHref(value) {
    try {
      const url = new URL(String(value), window.location.href);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch {
      return null;
    }
  }

  function setText(node, text) {
    const value = text == null ? "" : String(text);
    if (node.textContent !== value) node.textContent = value;
  }

  function setTitle(node, text) {
    if (text == null || text === "") node.removeAttribute("title");
    else if (node.title !== String(text)) node.title = String(text);
  }

  /** Swap in new children only when they differ, so a selection (say, of a checkpoint URI
   *  being copied) survives the polls that change nothing. */
  function replaceChildren(node, children) {
    const fresh = children.filter((c) => c != null);
    const old = node.childNodes;
    if (old.length === fresh.length && fresh.every((c, i) => old[i].isEqualNode(c))) return;
    node.replaceChildren(...fresh);
  }

  // --- formatting ----------------------------------------------------------------------------------

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const nf1 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 });

  function fmtInt(v) {
    return isNum(v) ? nf0.format(v) : "—";
  }

  /** 3,415 · 12.3k · 444k · 1.52M */
  function fmtCompact(v) {
    if (!isNum(v)) return "—";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + "B";
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e8 ? 0 : a >= 1e7 ? 1 : 2) + "M";
    if (a >= 1e5) return (v / 1e3).toFixed(0) + "k";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (a >= 100) return nf0.format(v);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function fmtPct(fraction, digits = 1) {
    return isNum(fraction) ? (fraction * 100).toFixed(digits) + "%" : "—";
  }

  function fmtLoss(v) {
    if (!isNum(v)) return "—";
    const a = Math.abs(v);
    return a >= 100 ? v.toFixed(1) : a >= 1 ? v.toFixed(3) : v.toFixed(4);
  }

  function fmtDuration(seconds) {
    if (!isNum(seconds)) return "—";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
    const hours = Math.floor(m / 60);
    if (hours < 48) return hours + "h " + String(m % 60).padStart(2, "0") + "m";
    return Math.floor(hours / 24) + "d " + (hours % 24) + "h";
  }

  const nowS = () => Date.now() / 1000;
  const since = (t) => (isNum(t) ? nowS() - t : null);

  const pad2 = (n) => String(n).padStart(2, "0");
  const hms = (d) => pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
  const ymd = (d) => d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate());

  /** 14:05:09 today, else 2026-11-22 14:05:09 (local time) */
  function fmtClock(t) {
    if (!isNum(t)) return "—";
    const d = new Date(t * 1000);
    return d.toDateString() === new Date().toDateString() ? hms(d) : ymd(d) + " " + hms(d);
  }

  function fmtDate(t) {
    return isNum(t) ? ymd(new Date(t * 1000)) + " " + hms(new Date(t * 1000)) : "—";
  }

  const BYTES = new Set(["memory", "object_store_memory"]);

  function fmtAmount(name, value) {
    if (!isNum(value)) return "—";
    if (BYTES.has(name)) return (value / 2 ** 30).toFixed(value >= 10 * 2 ** 30 ? 0 : 1) + " GiB";
    return Number.isInteger(value) ? nf0.format(value) : value.toFixed(2).replace(/\.?0+$/, "");
  }

  /** "14 / 32", "640 / 2,048 GiB": what jobs hold of the cluster's total */
  function fmtUsage(name, busy, total) {
    if (!BYTES.has(name)) return fmtAmount(name, busy) + " / " + fmtAmount(name, total);
    const gib = (v) => nf0.format(v / 2 ** 30);
    return gib(busy) + " / " + gib(total) + " GiB";
  }

  /** Ray resources in a useful order: accelerators first, then CPU, then the rest. */
  function resourceNames(resources) {
    const rank = (k) => (k === "GPU" ? 0 : k === "TPU" ? 1 : k === "CPU" ? 2 : BYTES.has(k) ? 4 : 3);
    return Object.keys(resources || {})
      .filter((k) => !k.startsWith("node:") && !k.startsWith("accelerator_type:") && !k.startsWith("bundle_"))
      .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  }

  function fmtResources(perWorker) {
    return resourceNames(perWorker)
      .filter((k) => perWorker[k])
      .map((k) => fmtAmount(k, perWorker[k]) + " " + (BYTES.has(k) ? "mem" : k));
  }

  function checkpointStep(uri) {
    const match = /checkpoint_0*(\d+)\/?(?:[?#].*)?$/.exec(String(uri || ""));
    return match ? Number(match[1]) : null;
  }

  function dashboardJobUrl(dashboard, submissionId) {
    const base = safeHref(dashboard);
    if (!base || !submissionId) return null;
    return base.replace(/\/+$/, "") + "/#/jobs/" + encodeURIComponent(submissionId);
  }

  const submissionOf = (job) => job.submission_id || job.submission || null;

  /** The rates to show for a job: the open job's own metrics stream, else the service's view. */
  function ratesOf(job) {
    if (job.live) return job.live;
    const summary = job.summary || {};
    const throughput = summary.throughput || {};
    return {
      samples_per_s: summary.samples_per_s,
      tokens_per_s: summary.tokens_per_s,
      mfu: throughput.mfu,
      tflops_per_worker: throughput.tflops_per_worker,
      loss: summary.final_train_loss,
    };
  }

  function rateParts(rates) {
    if (!rates) return ["—", ""];
    if (isNum(rates.tokens_per_s)) return [fmtCompact(rates.tokens_per_s), "tokens/s"];
    if (isNum(rates.samples_per_s)) return [fmtCompact(rates.samples_per_s), "samples/s"];
    return ["—", ""];
  }

  function progressOf(job) {
    const total = job.total_steps;
    if (!isNum(total) || total <= 0) return null;
    return Math.min(1, Math.max(0, (job.step || 0) / total));
  }

  function timeParts(job) {
    if (FINISHED.has(job.state)) return [fmtDuration(since(job.finished_at)), "ago", fmtDate(job.finished_at)];
    if (job.state === "admitted") return [fmtDuration(since(job.admitted_at)), "starting", "admitted " + fmtDate(job.admitted_at)];
    if (ACTIVE.has(job.state)) {
      const start = job.started_at || job.admitted_at;
      return [fmtDuration(since(start)), "running", "since " + fmtDate(start)];
    }
    return [fmtDuration(since(job.submitted_at)), "waiting", "submitted " + fmtDate(job.submitted_at)];
  }

  function badge(node, stateName, extra) {
    node.className = "badge s-" + stateName + (stateName === "running" ? " running" : "");
    setText(node, extra ? stateName + " · " + extra : stateName);
  }

  // --- page state ------------------------------------------------------------------------------------

  const page = {
    info: null,
    jobs: [], // this page's jobs, as the service picked them
    total: 0, // the jobs that match the search and the state picked, on every page
    counts: {}, // those that match the search, by state
    offset: 0,
    stateFilter: null,
    text: "",
    showFinished: true,
    busy: false,
    again: false, // the search, state or page changed while a poll was on its way: ask again
    timer: null,
    typing: null,
  };

  // --- header, counts, resources --------------------------------------------------------------------

  // --- a running job's loss at a glance, in its queue row --------------------------------------

  const SVG = "http://www.w3.org/2000/svg";
  const SPARK_W = 120;
  const SPARK_H = 22;

  function sparkline() {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 " + SPARK_W + " " + SPARK_H);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    svg.append(document.createElementNS(SVG, "polyline"));
    return svg;
  }

  /** The job's newest training losses ([[step, loss], ...]) as a line scaled to their range */
  function drawSparkline(svg, trail) {
    const points = (trail || []).filter((p) => isNum(p[0]) && isNum(p[1]));
    svg.dataset.points = String(points.length);
    svg.style.display = points.length < 2 ? "none" : "";
    if (points.length < 2) return;
    const steps = points.map((p) => p[0]);
    const losses = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
    const [lo, hi] = [Math.min(...losses), Math.max(...losses)];
    const xy = points.map(([step, loss]) => {
      const x = x1 > x0 ? ((step - x0) / (x1 - x0)) * SPARK_W : 0;
      const y = SPARK_H - 2 - (hi > lo ? (loss - lo) / (hi - lo) : 0.5) * (SPARK_H - 4);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    svg.firstChild.setAttribute("points", xy.join(" "));
    svg.setAttribute("aria-label", "training loss, steps " + fmtInt(x0) + "–" + fmtInt(x1) + ": " + fmtLoss(losses[losses.length - 1]));
  }

  // --- where a job's time went: its time ledger (core/ledger.py) --------------------------------

  // the ledger's buckets, in its order; every second from submission is in exactly one of them,
  // so their shares of the wall time are the widths of a stacked bar. Colours: app.css, .b-<bucket>
  const BUCKETS = {
    queued: "waiting in the queue, holding nothing",
    starting: "admitted, until the attempt's first step",
    training: "training on steps that were kept",
    evaluating: "evaluations",
    checkpointing: "training blocked on checkpoint saves",
    stopping: "from a stop or preemption request, or the last step, until the resources were let go",
    lost: "training that a rollback threw away, and the restart after it",
    stalled: "running, but no step for longer than the hang timeout",
  };

  /** [[bucket, seconds, share of the wall time], ...] in bucket order; null for a job with no
   * ledger (a record from before the service kept one) */
  function ledgerParts(ledger) {
    if (!ledger || !ledger.buckets) return null;
    const seconds = Object.keys(BUCKETS).map((b) => [b, isNum(ledger.buckets[b]) ? Math.max(0, ledger.buckets[b]) : 0]);
    const wall = seconds.reduce((sum, [, s]) => sum + s, 0);
    return seconds.map(([b, s]) => [b, s, wall > 0 ? s / wall : 0]);
  }

  /** "training 72.4% (2h 55m), queued 1.9% (4m 10s), ..." for the buckets that hold time */
  function ledgerText(parts) {
    const held = parts.filter(([, s]) => s > 0);
    if (!held.length) return "no time yet";
    return held.map(([b, s, share]) => b + " " + fmtPct(share) + " (" + fmtDuration(s) + ")").join(", ");
  }

  const ledgerSegments = () => Object.keys(BUCKETS).map((b) => h("span", { class: "seg b-" + b, "data-bucket": b }));

  /** A stacked bar with one segment per bucket, for a queue row (the job view's is in index.html) */
  function ledgerBar() {
    return h("div", { class: "ledger small", role: "img" }, ledgerSegments());
  }

  function drawLedger(bar, ledger) {
    const parts = ledgerParts(ledger);
    bar.hidden = !parts;
    if (!parts) return;
    parts.forEach(([bucket, seconds, share], i) => {
      const seg = bar.children[i];
      seg.hidden = share <= 0;
      seg.style.width = (share * 100).toFixed(3) + "%";
      setTitle(seg, bucket + ": " + fmtPct(share) + " · " + fmtDuration(seconds));
    });
    const goodput = ledger.goodput && ledger.goodput.time;
    const text = (isNum(goodput) ? "Goodput " + fmtPct(goodput) + ". " : "") + "Time by bucket: " + ledgerText(parts);
    if (bar.getAttribute("aria-label") !== text) bar.setAttribute("aria-label", text);
    setTitle(bar, text);
  }

  /** The cluster's time goodput beside the state tiles; none from a service without ledgers */
  function goodputTile(goodput) {
    if (!goodput) return null;
    const title =
      "Cluster goodput: time spent training on kept steps / wall time since submission, over every job, " +
      "weighted by the accelerators each asks for (= scheduling × runtime goodput; program goodput is MFU)";
    return h(
      "div",
      { class: "tile goodput", id: "goodput-tile", title },
      h("div", { class: "n" }, fmtPct(goodput.time)),
      h("div", { class: "label" }, h("span", { class: "swatch b-training" }), "goodput"),
      h("div", { class: "factors" }, "scheduling " + fmtPct(goodput.scheduling)),
      h("div", { class: "factors" }, "runtime " + fmtPct(goodput.runtime)),
      isNum(goodput.program) ? h("div", { class: "factors" }, "program (MFU) " + fmtPct(goodput.program)) : null,
    );
  }

  /** "2", or an elastic job's size now and its range: "3/2..8" (running), "2..8" (waiting) */
  function workersText(job) {
    if (!job.elastic) return fmtInt(job.workers);
    const now = Object.values(job.placement || {}).reduce((a, b) => a + b, 0);
    const range = job.elastic[0] + ".." + job.elastic[1];
    return now ? now + "/" + range : range;
  }

  /** The newest node events of the last hour ("3f2a9c1d joined 2m ago"), nodes draining, and
   * what an autoscaler may still add ("autoscaler may add 2 gpu-8x") */
  function nodeEvents(info) {
    const recent = (info.node_events || []).filter((e) => since(e.time) < 3600).slice(-3);
    const draining = (info.draining || []).map((n) => shortNode(n) + " draining")
      .concat(Object.keys(info.unreachable || {}).map((n) => shortNode(n) + " not answering"));
    const events = draining.concat(recent.map((e) => shortNode(e.node) + " " + e.event + " " + fmtDuration(since(e.time)) + " ago"));
    if (!info.autoscaler) return events;
    const room = Object.entries(info.autoscaler.may_add).filter(([, n]) => n).map(([name, n]) => n + " " + name);
    return events.concat(["autoscaler may add " + (room.join(", ") || "none")]);
  }

  function renderInfo(info) {
    const dashboard = safeHref(info.dashboard);
    const link = $("dashboard-link");
    link.hidden = !dashboard;
    if (dashboard && link.href !== dashboard) link.href = dashboard;

    const counts = info.jobs || {};
    const total = Object.values(counts).reduce((a, b) => a + (b || 0), 0);
    const active = STATES.filter((s) => ACTIVE.has(s)).reduce((a, s) => a + (counts[s] || 0), 0);
    const facts = [
      ["Nodes", [fmtInt(info.nodes)].concat(nodeEvents(info)).join(" · "), "nodes Ray lists alive, the newest nodes that joined, left or were lost, and the nodes an autoscaler may still add"],
      ["Jobs", fmtInt(active) + " active · " + fmtInt(total) + " total", "active: admitted, running or stopping"],
      ["Service up", fmtDuration(since(info.started_at)), "since " + fmtDate(info.started_at)],
      ["Generation", fmtInt(info.generation), "how many times a service has taken over this store"],
      ["Store", info.store || "—", info.store],
    ];
    replaceChildren(
      $("facts"),
      facts.map(([k, v, title]) => h("div", { title }, h("dt", null, k), h("dd", { class: k === "Store" ? "mono" : null }, v))),
    );

    const tiles = STATES.filter((s) => counts[s] || s === "running" || s === "queued").map((s) => {
      const tile = h(
        "button",
        { type: "button", class: "tile" + (page.stateFilter === s ? " on" : ""), title: "Show only " + s + " jobs" },
        h("div", { class: "n" }, fmtInt(counts[s] || 0)),
        h("div", { class: "label" }, h("span", { class: "swatch s-" + s }), s),
      );
      tile.addEventListener("click", () => {
        page.stateFilter = page.stateFilter === s ? null : s;
        page.offset = 0;
        renderInfo(page.info);
        refresh();
      });
      return tile;
    });
    replaceChildren($("counts"), tiles);
    replaceChildren($("goodput"), [goodputTile(info.goodput)]);

    const resources = info.resources || {};
    const totals = resources.total || {};
    const busy = resources.busy || {};
    const rows = resourceNames(totals)
      .filter((k) => totals[k])
      .map((k) => {
        const share = Math.min(1, (busy[k] || 0) / totals[k]);
        const bar = h("div", { class: "bar" }, h("span"));
        bar.firstChild.style.width = (share * 100).toFixed(1) + "%";
        return h(
          "div",
          { class: "res-row", title: fmtPct(share) + " of " + k + " held by jobs" },
          h("span", { class: "res-name" }, BYTES.has(k) ? k.replace(/_/g, " ") : k),
          bar,
          h("span", { class: "res-value" }, fmtUsage(k, busy[k] || 0, totals[k])),
        );
      });
    $("resources").hidden = rows.length === 0;
    replaceChildren($("resources"), rows);
    renderQueues(info.queues);
    setText($("foot-text"), "Updates every " + POLL_MS / 1000 + " s from the orchestrator service (generation " + fmtInt(info.generation) + ").");
  }

  // --- queues: each one's use against its nominal quota, and what it borrows or lends -----------

  /** A number as Python's "{:g}" writes it (6 significant digits, no trailing zeros), so the
   * panel's figures are the ones `orchestrator queue` prints */
  function fmtG(v) {
    if (!isNum(v)) return "—";
    const [mantissa, power] = v.toExponential(5).split("e");
    const exponent = Number(power);
    const trim = (s) => (s.includes(".") ? s.replace(/\.?0+$/, "") : s);
    if (exponent < -4 || exponent >= 6) {
      return trim(mantissa) + "e" + (exponent < 0 ? "-" : "+") + String(Math.abs(exponent)).padStart(2, "0");
    }
    return trim(v.toFixed(5 - exponent));
  }

  // Python's sorted(): by code point, as the CLI lists queues
  const byCodePoint = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

  /** "borrows 8 GPU", "lends 2.5 GPU": what `queue_lines` appends, the same words and numbers */
  function borrowLendLines(q) {
    const positive = (amounts) => Object.entries(amounts || {}).filter(([, v]) => v > 0);
    return positive(q.borrowed)
      .map(([r, v]) => "borrows " + fmtG(v) + " " + r)
      .concat(positive(q.lent).map(([r, v]) => "lends " + fmtG(v) + " " + r));
  }

  /** One bar segment, as wide as its share of the bar's scale */
  function quotaSegment(kind, amount, scale) {
    const seg = h("span", { class: "seg q-" + kind, "data-part": kind });
    seg.style.width = (scale > 0 ? (Math.max(0, amount) / scale) * 100 : 0).toFixed(3) + "%";
    return seg;
  }

  /** Use within the nominal quota, use borrowed beyond it, and the unused quota others borrow
   * (lent), on a scale of the larger of use and quota: the nominal quota ends where borrowing begins */
  function quotaBar(used, nominal, lent) {
    const scale = Math.max(used, nominal);
    return h(
      "div",
      { class: "quota-bar" },
      quotaSegment("within", Math.min(used, nominal), scale),
      quotaSegment("borrowed", used - nominal, scale),
      quotaSegment("lent", lent, scale),
    );
  }

  /** A line per resource of the nominal quota: "GPU [bar] 8 / 4" */
  function quotaLines(q) {
    const lines = Object.entries(q.nominal || {}).map(([r, nominal]) => {
      const used = (q.used || {})[r] || 0;
      const lent = (q.lent || {})[r] || 0;
      const title = r + ": uses " + fmtG(used) + " of a nominal quota of " + fmtG(nominal);
      return h(
        "div",
        { class: "quota", "data-resource": r, title },
        h("span", { class: "res-name" }, r),
        quotaBar(used, nominal, lent),
        h("span", { class: "res-value" }, fmtG(used) + " / " + fmtG(nominal)),
      );
    });
    return lines.length ? lines : [h("span", { class: "muted" }, "no quota")];
  }

  /** Its cohort; a queue in none with a quota has a hard cap: it neither borrows nor lends */
  function cohortCell(q) {
    if (q.cohort) return h("td", { class: "cohort" }, q.cohort);
    const capped = Object.keys(q.nominal || {}).length > 0;
    const title = capped ? "in no cohort: its nominal quota is a hard cap, it neither borrows nor lends" : null;
    return h("td", { class: "cohort faded", title }, capped ? "hard cap" : "—");
  }

  /** "8 GPU": the most it may borrow beyond its nominal quota (from the applied configuration) */
  function borrowingLimitCell(q, settings) {
    const limit = Object.entries((settings && settings.borrowing_limit) || {});
    if (limit.length) return h("td", { class: "limit" }, limit.map(([r, v]) => fmtG(v) + " " + r).join(", "));
    const title = q.cohort ? "no limit but the cohort's unused quota" : null;
    return h("td", { class: "limit faded", title }, "—");
  }

  function queueRow(name, q, settings) {
    const extra = borrowLendLines(q);
    return h(
      "tr",
      { "data-queue": name },
      h("td", { class: "name" }, name),
      cohortCell(q),
      h("td", { class: "order", title: q.order === "fifo" ? "first in, first out" : "least attained service first" }, q.order || "las-share"),
      h("td", { class: "use" }, h("div", { class: "quota-lines" }, quotaLines(q))),
      h("td", { class: "extra" + (extra.length ? "" : " faded") }, extra.length ? extra.map((line) => h("div", null, line)) : "—"),
      borrowingLimitCell(q, settings),
    );
  }

  /** The panel, only while a queue configuration is applied (`orchestrator queues apply`) */
  function renderQueues(queues) {
    const use = (queues && queues.use) || {};
    const names = Object.keys(use).sort(byCodePoint);
    $("queues").hidden = names.length === 0;
    const settings = (queues && queues.config && queues.config.queues) || {};
    setText($("queues-count"), names.length ? fmtInt(names.length) : "");
    replaceChildren($("queues-body"), names.map((name) => queueRow(name, use[name], settings[name])));
  }

  function setLive(ok, message) {
    const live = $("live");
    live.dataset.state = ok ? "ok" : "error";
    setText($("live-text"), ok ? "live · " + fmtClock(nowS()) : message);
  }

  // --- a job's health: ranks that straggle, a hang, the nodes it avoids ------------------------------

  const listOf = (value) => (Array.isArray(value) ? value : []);

  /** A node id as the page shows node ids: its first 8 characters */
  const shortNode = (id) => String(id).slice(0, 8);

  /** A node id, shortened, with the whole id on hover */
  function nodeLabel(id) {
    return h("span", { class: "mono node", title: String(id) }, shortNode(id));
  }

  const fmtRatio = (ratio) => (isNum(ratio) ? ratio.toFixed(2) + "x" : "—");

  const HUNG_TEXT =
    "Hung: no step progress past the hang timeout. Its ranks' stacks are saved beside the run " +
    "(the hung event in its history says where) and it restarts from its newest checkpoint.";
  const HUNG_SHORT = "Hung: no step progress past the hang timeout; stacks saved, restarting";

  /** "Rank 1 on node 5f0c61e1 (10.0.0.7) is a straggler: 1.91x the median rank's compute per step" */
  function stragglerLine(s) {
    return h(
      "li",
      { class: "callout warn", "data-kind": "straggler" },
      "Rank " + s.rank,
      s.node != null ? [" on node ", nodeLabel(s.node)] : null,
      s.ip ? " (" + s.ip + ")" : null,
      " is a straggler: " + fmtRatio(s.ratio) + " the median rank's compute per step",
    );
  }

  /** The same, in a line of the row marker's title */
  function stragglerSummary(s) {
    const where = [s.node != null ? "node " + shortNode(s.node) : null, s.ip || null].filter(Boolean).join(", ");
    return "Straggler: rank " + s.rank + " at " + fmtRatio(s.ratio) + " the median rank's compute per step" + (where ? " (" + where + ")" : "");
  }

  function avoidLine(nodes) {
    const labels = nodes.flatMap((id, i) => (i ? [", ", nodeLabel(id)] : [nodeLabel(id)]));
    return h(
      "li",
      { class: "callout", "data-kind": "avoiding" },
      "Avoiding node(s) ",
      labels,
      " (stragglers ran there): the job is not placed on them again.",
    );
  }

  /** A job of replica groups: how many train, and each group's start, heal or loss */
  function groupsLine(job) {
    const placed = listOf(job.group_placements);
    if (!placed.length) return null;
    const groups = job.replica_groups || {};
    const lost = (nodes) => !Object.keys(nodes).length;  // the service's word: its nodes were lost
    const training = placed.filter((nodes, i) => !lost(nodes) && (groups[String(i)] || {}).state === "training").length;
    const degraded = job.ledger && isNum(job.ledger.degraded_s) && job.ledger.degraded_s > 0 ? job.ledger.degraded_s : 0;
    const parts = placed.map((nodes, i) => {
      const g = groups[String(i)] || {};
      const state = lost(nodes) ? "lost, waiting for nodes" : g.state || "starting";
      let text = "group " + i + " " + state;
      if (lost(nodes)) return text;
      if (isNum(g.joined_at) && isNum(g.started_at)) text += ", started in " + (g.joined_at - g.started_at).toFixed(1) + " s";
      if (isNum(g.healed_at)) text += ", healed from a peer at step " + fmtInt(g.healed_step) + (isNum(g.started_at) ? " (" + (g.healed_at - g.started_at).toFixed(1) + " s after its start)" : "");
      return text;
    });
    const kind = training < placed.length ? "callout warn" : "callout";
    const head = "Replica groups: " + training + " of " + placed.length + " training" + (degraded ? " · degraded " + fmtDuration(degraded) : "");
    return h("li", { class: kind, "data-kind": "replica-groups" }, head + " · " + parts.join(" · "));
  }

  function healthLines(job) {
    const avoided = listOf(job.avoid_nodes);
    return [
      job.hung ? h("li", { class: "callout error", "data-kind": "hung" }, HUNG_TEXT) : null,
      ...listOf(job.stragglers).map(stragglerLine),
      avoided.length ? avoidLine(avoided) : null,
      groupsLine(job),
    ];
  }

  /** The open job's warnings, under its callout; hidden while it has none */
  function renderHealth(job) {
    const list = $("job-health");
    const lines = job ? healthLines(job).filter(Boolean) : [];
    list.hidden = !lines.length;
    replaceChildren(list, lines);
  }

  /** A row's "⚠" while its job has stragglers or is hung, saying which in its title */
  function drawHealthFlag(flag, job) {
    const lines = (job.hung ? [HUNG_SHORT] : []).concat(listOf(job.stragglers).map(stragglerSummary));
    flag.hidden = !lines.length;
    flag.className = "flag" + (job.hung ? " hung" : "");
    setTitle(flag, lines.join("\n"));
    if (lines.length) flag.setAttribute("aria-label", lines.join(". "));
  }

  // --- the queue table ---------------------------------------------------------------------------------

  const rows = new Map(); // job id -> {tr, cells}: rows are updated in place, not rebuilt

  function makeRow(jobId) {
    const c = {
      name: h("div", { class: "name" }),
      id: h("div", { class: "id mono" }),
      badge: h("span", { class: "badge" }),
      flag: h("span", { class: "flag", role: "img", hidden: true }, "⚠"),
      priority: h("td", { class: "num" }),
      queue: h("td"),
      workers: h("td"),
      bar: h("div", { class: "bar" }, h("span")),
      steps: h("div", { class: "steps" }),
      eta: h("td", { class: "num" }),
      rate: h("span"),
      rateSub: h("span", { class: "sub" }),
      mfu: h("td", { class: "num" }),
      restarts: h("td", { class: "num" }),
      preempt: h("span"),
      preemptSub: h("span", { class: "sub" }),
      ledger: ledgerBar(),
      time: h("span"),
      timeSub: h("span", { class: "sub" }),
      note: h("div", { class: "note" }),
      link: h("a", { class: "ext", target: "_blank", rel: "noopener noreferrer", title: "Open in Ray dashboard" }, "↗"),
    };
    c.timeCell = h("td", { class: "num time-cell" }, c.time, c.timeSub, c.ledger);
    c.spark = sparkline();
    c.progressCell = h("td", { class: "progress-cell" }, c.bar, c.steps, c.spark);
    const tr = h(
      "tr",
      { "data-job-id": jobId },
      h("td", { class: "job-cell" }, c.name, c.id),
      h("td", null, c.badge, c.flag),
      c.priority,
      c.queue,
      c.workers,
      c.progressCell,
      c.eta,
      h("td", { class: "num" }, c.rate, c.rateSub),
      c.mfu,
      c.restarts,
      h("td", { class: "num" }, c.preempt, c.preemptSub),
      c.timeCell,
      h("td", { class: "note-cell" }, c.note),
      h("td", { class: "icon-col" }, c.link),
    );
    tr.addEventListener("click", () => openJob(jobId));
    c.link.addEventListener("click", (event) => event.stopPropagation());
    return { tr, c };
  }

  function updateRow(row, job) {
    const c = row.c;
    setText(c.name, job.name);
    setTitle(c.name, job.run && job.run !== job.name ? job.name + " (run " + job.run + ")" : job.name);
    setText(c.id, job.id);
    setTitle(c.id, job.id);
    badge(c.badge, job.state, job.state === "stopping" && job.stop_requested ? job.stop_requested : null);
    drawHealthFlag(c.flag, job);
    setText(c.priority, fmtInt(job.priority));
    setText(c.queue, job.queue || "default");
    const resources = fmtResources(job.per_worker || {});
    setText(c.workers, workersText(job) + " × " + (resources[0] || "worker"));
    setTitle(c.workers, workersText(job) + " worker(s)" + (job.elastic ? " (now/min..max)" : "") + ", each " + resources.join(", "));

    const progress = progressOf(job);
    c.bar.hidden = progress == null;
    c.bar.className = "bar s-" + job.state;
    if (progress != null) c.bar.firstChild.style.width = (progress * 100).toFixed(1) + "%";
    setText(
      c.steps,
      progress == null
        ? job.step
          ? "step " + fmtInt(job.step)
          : "—"
        : fmtInt(job.step) + " / " + fmtInt(job.total_steps) + "  ·  " + fmtPct(progress, 0),
    );

    drawSparkline(c.spark, job.loss_trail);
    setText(c.eta, ACTIVE.has(job.state) && isNum(job.remaining_s) ? fmtDuration(job.remaining_s) : "—");
    c.eta.classList.toggle("faded", !(ACTIVE.has(job.state) && isNum(job.remaining_s)));
    const rates = ACTIVE.has(job.state) || FINISHED.has(job.state) ? ratesOf(job) : null;
    const [rate, unit] = rateParts(rates);
    setText(c.rate, rate);
    setText(c.rateSub, unit);
    setText(c.mfu, fmtPct(rates && rates.mfu));
    c.mfu.classList.toggle("faded", !(rates && isNum(rates.mfu)));
    setText(c.restarts, fmtInt(job.restarts || 0));
    c.restarts.classList.toggle("faded", !job.restarts);
    setText(c.preempt, fmtInt(job.preemptions || 0));
    setText(c.preemptSub, job.preemptions ? fmtInt(job.steps_lost || 0) + " lost" : "");
    c.preempt.parentNode.classList.toggle("faded", !job.preemptions);

    const [time, timeSub, timeTitle] = timeParts(job);
    setText(c.time, time);
    setText(c.timeSub, timeSub);
    setTitle(c.timeCell, timeTitle);
    drawLedger(c.ledger, job.ledger);

    const note = job.state === "failed" || job.state === "stopped" ? job.reason || job.note : job.note || job.reason;
    setText(c.note, note || "");
    setTitle(c.note, note);
    c.note.classList.toggle("reason", job.state === "failed");

    const href = dashboardJobUrl(page.info && page.info.dashboard, submissionOf(job));
    c.link.hidden = !href;
    if (href && c.link.href !== href) c.link.href = href;
    row.tr.classList.toggle("open", job.id === detail.id);
  }

  function renderQueue() {
    const body = $("queue-body");
    const seen = new Set();
    let previous = null;
    for (const job of page.jobs) {
      let row = rows.get(job.id);
      if (!row) {
        row = makeRow(job.id);
        rows.set(job.id, row);
      }
      updateRow(row, job);
      seen.add(job.id);
      const wanted = previous ? previous.nextSibling : body.firstChild;
      if (wanted !== row.tr) body.insertBefore(row.tr, wanted);
      previous = row.tr;
    }
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        rows.delete(id);
      }
    }
    const narrowed = Boolean(page.text || page.stateFilter || !page.showFinished);
    $("queue-empty").hidden = page.total > 0 || narrowed;
    $("queue-none").hidden = page.total > 0 || !narrowed;
    renderPager();
  }

  /** "51–100 of 10,950", the search's matches by state, and the buttons to the pages around */
  function renderPager() {
    const last = page.offset + page.jobs.length;
    const range = page.total > page.jobs.length ? fmtInt(page.offset + 1) + "–" + fmtInt(last) + " of " + fmtInt(page.total) : fmtInt(page.total);
    const found = STATES.filter((s) => page.counts[s]).map((s) => fmtInt(page.counts[s]) + " " + s);
    setText($("job-count"), range + (page.text && found.length ? " · found " + found.join(", ") : ""));
    setText($("page-range"), page.jobs.length ? range : "");
    $("pager").hidden = page.offset === 0 && page.total <= PAGE_SIZE;
    $("page-prev").disabled = page.offset === 0;
    $("page-next").disabled = last >= page.total;
  }

  /** Go to the page that starts at `offset` (0 to the last page's start) */
  function turnTo(offset) {
    const lastStart = Math.max(0, Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
    page.offset = Math.min(Math.max(offset, 0), lastStart);
    refresh();
  }

  /** The page's query for the service: this page of the jobs the search and the state pick */
  function queueUrl() {
    const params = new URLSearchParams({ offset: String(page.offset), limit: String(PAGE_SIZE) });
    if (page.stateFilter) params.set("state", page.stateFilter);
    if (page.text) params.set("q", page.text);
    if (!page.showFinished) params.set("finished", "0");
    return "api/queue?" + params.toString();
  }

  // --- charts --------------------------------------------------------------------------------------------

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  /** Tick labels with as many decimals as their spacing needs: 2.5 3.0 3.5, 2,000 4,000, 12k. */
  function fmtSplits(splits) {
    const finite = splits.filter(isNum);
    const spacing = finite.length > 1 ? Math.abs(finite[1] - finite[0]) : Math.abs(finite[0] || 1);
    const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(spacing || 1))));
    return splits.map((v) =>
      !isNum(v)
        ? ""
        : Math.abs(v) >= 1e4
          ? fmtCompact(v)
          : v.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals }),
    );
  }

  function axis(extra) {
    return {
      stroke: cssVar("--axis"),
      grid: { stroke: cssVar("--grid"), width: 1 },
      ticks: { stroke: cssVar("--grid"), width: 1, size: 4 },
      font: "11px system-ui, sans-serif",
      values: (u, splits) => fmtSplits(splits),
      ...extra,
    };
  }

  /** The legend shows the newest values whenever the pointer is not over the chart. */
  function legendAtNewest(u) {
    if (u.cursor.idx == null && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 }, false);
  }

  /** A uPlot chart over steps; `series` are [label, color, options]. */
  function makeChart(node, series, axes, scales) {
    const opts = {
      width: Math.max(node.clientWidth, 200),
      height: CHART_HEIGHT,
      scales: { x: { time: false }, ...scales },
      cursor: { drag: { x: true, y: false }, points: { size: 6 } },
      legend: { live: true },
      hooks: { setCursor: [legendAtNewest] },
      series: [
        { label: "step", value: (u, v) => (v == null ? "—" : fmtInt(v)) },
        ...series.map(([label, color, extra]) => ({
          label,
          stroke: color,
          width: 1.75,
          spanGaps: true,
          points: { show: false },
          ...extra,
        })),
      ],
      axes: [axis({ size: 36 }), ...axes],
    };
    const data = [[], ...series.map(() => [])];
    const chart = new uPlot(opts, data, node);
    const resize = new ResizeObserver(() => {
      const width = Math.max(node.clientWidth, 200);
      if (width !== chart.width) chart.setSize({ width, height: CHART_HEIGHT });
    });
    resize.observe(node);
    return { chart, data, resize, node };
  }

  function destroyChart(entry) {
    if (!entry) return;
    entry.resize.disconnect();
    entry.chart.destroy();
  }

  /** Hand the grown arrays to uPlot: one canvas repaint, the DOM stays as it is. */
  function redraw(entry, emptyId) {
    const steps = entry.data[0];
    entry.chart.setData(entry.data, true);
    legendAtNewest(entry.chart); // uPlot refreshes the legend on new data only under the pointer
    entry.node.dataset.points = String(steps.length);
    entry.node.dataset.lastStep = String(steps.length ? steps[steps.length - 1] : -1);
    $(emptyId).hidden = steps.length > 0;
  }

  const valueOf = (fmt) => (u, v) => (v == null ? "—" : fmt(v));

  function lossChart() {
    return makeChart(
      $("chart-loss"),
      [
        ["loss", cssVar("--chart-1-soft"), { width: 1, value: valueOf(fmtLoss) }],
        ["smoothed", cssVar("--chart-1"), { width: 2, value: valueOf(fmtLoss) }],
      ],
      [axis({ size: 48 })],
    );
  }

  // MFU is throughput times a constant per job, so it is a caption and a stat, not a second line
  function rateChart(tokens) {
    return makeChart(
      $("chart-rate"),
      [[tokens ? "tokens/s" : "samples/s", cssVar("--chart-2"), { value: valueOf(fmtCompact), fill: cssVar("--chart-2-soft") }]],
      [axis({ size: 48 })],
    );
  }

  const EVAL_COLORS = ["--chart-1", "--chart-4", "--chart-2", "--chart-3"];
  // eval keys come from the metrics records: only plain names become series labels
  const EVAL_KEY = /^eval_[A-Za-z0-9_]{1,40}$/;

  function evalChart(keys) {
    const fraction = (k) => /acc|f1|precision|recall/.test(k);
    const hasFraction = keys.some(fraction);
    const series = keys.map((k, i) => [
      k.replace(/^eval_/, ""),
      cssVar(EVAL_COLORS[i % EVAL_COLORS.length]),
      {
        scale: fraction(k) ? "fraction" : /loss/.test(k) ? "y" : "other",
        show: fraction(k) || /loss/.test(k),
        points: { show: true, size: 5, fill: cssVar("--card") },
        value: valueOf(fraction(k) ? (v) => fmtPct(v) : fmtLoss),
      },
    ]);
    const axes = [axis({ size: 48 })];
    if (hasFraction) {
      axes.push(
        axis({ scale: "fraction", side: 1, size: 44, grid: { show: false }, values: (u, splits) => splits.map((v) => fmtPct(v, 0)) }),
      );
    }
    return makeChart($("chart-eval"), series, axes, { fraction: { range: [0, 1] } });
  }

  // --- the open job -----------------------------------------------------------------------------------

  const detail = {
    id: null,
    view: null,
    token: 0, // which job a request in flight was for
    lastStep: -1,
    lastTrainStep: -1,
    lastEvalStep: -1,
    ema: null,
    latest: null, // the newest training record
    loss: null,
    rate: null,
    evals: null,
    evalKeys: [],
    missing: false,
  };

  function resetDetail(id) {
    destroyChart(detail.loss);
    destroyChart(detail.rate);
    destroyChart(detail.evals);
    Object.assign(detail, {
      id,
      view: null,
      token: detail.token + 1,
      lastStep: -1,
      lastTrainStep: -1,
      lastEvalStep: -1,
      ema: null,
      latest: null,
      loss: null,
      rate: null,
      evals: null,
      evalKeys: [],
      missing: false,
    });
    for (const name of ["loss", "eval", "rate"]) {
      $("chart-" + name).dataset.points = "0";
      $("chart-" + name + "-empty").hidden = false;
    }
    for (const id of ["loss-caption", "eval-caption", "rate-caption"]) setText($(id), "");
  }

  function openJob(jobId) {
    const hash = "#/jobs/" + encodeURIComponent(jobId);
    if (window.location.hash !== hash) window.location.hash = hash; // routes through onRoute
    else onRoute();
  }

  function closeJob() {
    if (window.location.hash) history.replaceState(null, "", window.location.pathname + window.location.search);
    onRoute();
  }

  function routedJob() {
    const match = /^#\/jobs\/(.+)$/.exec(window.location.hash);
    if (!match) return null;
    try {
      return decodeURIComponent(match[1]);
    } catch {
      return null;
    }
  }

  function onRoute() {
    const jobId = routedJob();
    if (jobId === detail.id) return;
    resetDetail(jobId);
    $("job").hidden = !jobId;
    for (const [id, row] of rows) row.tr.classList.toggle("open", id === jobId);
    if (!jobId) return;
    const known = page.jobs.find((j) => j.id === jobId);
    if (known) renderJob(known); // at once, from the queue; the full view follows
    pollJob()
      .then(showJob)
      .catch((err) => console.warn("status page: reading the job failed:", err)); // the next tick retries
  }

  /** Scroll the job view to just below the sticky top bar (scrollIntoView would slide its title
   * under the bar, which covers the top of whatever is scrolled to the window's top edge) */
  function showJob() {
    const bar = document.querySelector(".topbar").getBoundingClientRect().height;
    const top = $("job").getBoundingClientRect().top + window.scrollY - bar - 12;
    window.scrollTo({ top: Math.max(top, 0), behavior: "smooth" });
  }

  async function pollJob() {
    const jobId = detail.id;
    const token = detail.token;
    if (!jobId) return;
    const view = await getJSON("api/jobs/" + encodeURIComponent(jobId), true);
    if (token !== detail.token) return;
    if (view === null) {
      detail.missing = true;
      renderMissing(jobId);
      return;
    }
    detail.missing = false;
    detail.view = view;
    // ask again for the newest step seen: an eval logged at that step may have come after it
    const records = await getJSON(
      "api/jobs/" + encodeURIComponent(jobId) + "/metrics?since=" + Math.max(detail.lastStep - 1, -1),
    );
    if (token !== detail.token) return;
    appendMetrics(records || []);
    renderJob(view);
  }

  function appendMetrics(records) {
    const train = [];
    const evals = [];
    for (const r of records) {
      if (!r || !isNum(r.step)) continue;
      detail.lastStep = Math.max(detail.lastStep, r.step);
      if ("loss" in r && r.step > detail.lastTrainStep) train.push(r);
      const keys = Object.keys(r).filter((k) => EVAL_KEY.test(k) && (isNum(r[k]) || r[k] === null));
      if (keys.length && r.step > detail.lastEvalStep) evals.push([r, keys]);
    }
    train.sort((a, b) => a.step - b.step);
    evals.sort((a, b) => a[0].step - b[0].step);

    if (train.length) {
      if (!detail.loss) detail.loss = lossChart();
      const rated = train.filter((r) => isNum(r.tokens_per_s) || isNum(r.samples_per_s));
      if (!detail.rate && rated.length) detail.rate = rateChart(rated.some((r) => isNum(r.tokens_per_s)));
      const [lx, raw, smooth] = detail.loss.data;
      for (const r of train) {
        if (r.step <= detail.lastTrainStep) continue; // a resumed job repeats steps: keep x increasing
        detail.lastTrainStep = r.step;
        const loss = isNum(r.loss) ? r.loss : null;
        if (loss != null) {
          // an EMA that starts at the first loss, so the line is not pulled towards zero
          detail.ema = detail.ema == null ? loss : SMOOTHING * detail.ema + (1 - SMOOTHING) * loss;
        }
        lx.push(r.step);
        raw.push(loss);
        smooth.push(detail.ema == null ? null : detail.ema);
        detail.latest = r;
        const rate = isNum(r.tokens_per_s) ? r.tokens_per_s : r.samples_per_s;
        if (detail.rate && isNum(rate)) {
          detail.rate.data[0].push(r.step);
          detail.rate.data[1].push(rate);
        }
      }
      redraw(detail.loss, "chart-loss-empty");
      if (detail.rate) redraw(detail.rate, "chart-rate-empty");
      setText($("loss-caption"), "· " + fmtInt(lx.length) + " points, last at step " + fmtInt(detail.lastTrainStep));
      const rateNow = detail.latest && (isNum(detail.latest.tokens_per_s) ? detail.latest.tokens_per_s : detail.latest.samples_per_s);
      const unit = isNum(detail.latest.tokens_per_s) ? " tokens/s" : " samples/s";
      const mfuNow = isNum(detail.latest.mfu) ? " · MFU " + fmtPct(detail.latest.mfu) : "";
      setText($("rate-caption"), isNum(rateNow) ? "· now " + fmtCompact(rateNow) + unit + mfuNow : "");
    }

    if (evals.length) {
      const keys = [...detail.evalKeys];
      for (const [, ks] of evals) for (const k of ks) if (!keys.includes(k)) keys.push(k);
      if (!detail.evals || keys.length !== detail.evalKeys.length) {
        // a new eval metric: rebuild the chart with one more series and the points so far
        const old = detail.evals;
        const oldKeys = detail.evalKeys;
        detail.evals = evalChart(keys);
        if (old) {
          detail.evals.data[0].push(...old.data[0]);
          keys.forEach((k, i) => {
            const j = oldKeys.indexOf(k);
            detail.evals.data[i + 1].push(...(j >= 0 ? old.data[j + 1] : old.data[0].map(() => null)));
          });
          destroyChart(old);
        }
        detail.evalKeys = keys;
      }
      const data = detail.evals.data;
      for (const [r] of evals) {
        if (r.step <= detail.lastEvalStep) continue;
        detail.lastEvalStep = r.step;
        data[0].push(r.step);
        keys.forEach((k, i) => data[i + 1].push(isNum(r[k]) ? r[k] : null));
      }
      redraw(detail.evals, "chart-eval-empty");
      const last = data[0].length - 1;
      const lossAt = keys.indexOf("eval_loss");
      setText(
        $("eval-caption"),
        "· " + fmtInt(data[0].length) + " evaluations" + (lossAt >= 0 && last >= 0 ? ", loss " + fmtLoss(data[lossAt + 1][last]) : ""),
      );
    }
  }

  function stat(key, value, sub, title) {
    return h("div", { class: "stat", title }, h("div", { class: "k" }, key), h("div", { class: "v" }, value), h("div", { class: "s" }, sub || " "));
  }

  function renderJob(job) {
    setText($("job-name"), job.name);
    badge($("job-state"), job.state, job.state === "stopping" && job.stop_requested ? job.stop_requested : null);
    replaceChildren($("job-sub"), [
      h("span", { class: "mono" }, job.id),
      job.queue ? h("span", null, "queue " + job.queue) : null,
      h("span", null, "priority " + fmtInt(job.priority)),
      h("span", null, job.preemptible ? "preemptible" : "not preemptible"),
      job.sweep ? h("span", null, "sweep " + job.sweep) : null,
    ]);

    const href = dashboardJobUrl(page.info && page.info.dashboard, submissionOf(job));
    const link = $("job-dashboard");
    link.hidden = !href;
    if (href && link.href !== href) link.href = href;
    setTitle(link, href ? "Ray Job " + submissionOf(job) : null);

    const callout = $("job-callout");
    let text = null;
    let kind = "";
    if (job.state === "failed") [text, kind] = ["Failed: " + (job.reason || "no reason given"), "error"];
    else if (job.state === "stopped") text = "Stopped: " + (job.reason || "by request");
    else if (job.state === "stopping") [text, kind] = ["Checkpointing, then " + (job.stop_requested === "preempt" ? "back to the queue (preempted)" : "stopping") + ".", "warn"];
    else if (job.state === "preempted") [text, kind] = ["Preempted " + fmtInt(job.preemptions) + "×, waiting to resume at step " + fmtInt(job.step) + (job.note ? ": " + job.note : "."), "warn"];
    else if (job.note) text = job.note;
    else if (job.reason) text = job.reason;
    if (job.mlflow) [text, kind] = [text ? text + " · " + job.mlflow : job.mlflow, kind || "warn"];  // records its MLflow run lacks
    callout.hidden = !text;
    callout.className = "callout" + (kind ? " " + kind : "");
    setText(callout, text || "");
    renderHealth(job);

    const progress = progressOf(job);
    const rates = detail.latest ? detail.latest : ratesOf(job);
    const [rate, unit] = rateParts(ACTIVE.has(job.state) || FINISHED.has(job.state) || detail.latest ? rates : null);
    const [time, timeSub] = timeParts(job);
    const resources = fmtResources(job.per_worker || {});
    const stats = [
      stat("Progress", progress == null ? "—" : fmtPct(progress), fmtInt(job.step) + (isNum(job.total_steps) ? " / " + fmtInt(job.total_steps) : " steps")),
      stat("ETA", FINISHED.has(job.state) ? "done" : fmtDuration(job.remaining_s), isNum(job.step_time_s) ? (job.step_time_s * 1000).toFixed(0) + " ms/step" : ""),
      stat("Throughput", rate, unit === "tokens/s" ? "tokens/s · " + fmtCompact(rates.samples_per_s) + " samples/s" : unit),
      stat("MFU", fmtPct(rates && rates.mfu), rates && isNum(rates.tflops_per_worker) ? rates.tflops_per_worker.toFixed(0) + " TFLOP/s a worker" : ""),
      stat("Loss", fmtLoss(rates && rates.loss), detail.latest ? "step " + fmtInt(detail.latest.step) : ""),
      stat("Restarts", fmtInt(job.restarts || 0), "attempt " + fmtInt(job.attempt || 0), "Admissions that did not resume a preemption"),
      stat("Preemptions", fmtInt(job.preemptions || 0), fmtInt(job.steps_lost || 0) + " steps lost"),
      stat("Workers", workersText(job) + " × " + (resources[0] || "worker"), (job.elastic ? "elastic · " : "") + resources.slice(1).join(" · ")),
      stat({ ago: "Finished", running: "Running for", starting: "Starting for" }[timeSub] || "Waiting for", timeSub === "ago" ? time + " ago" : time, ""),
    ];
    replaceChildren($("job-stats"), stats);

    renderLedger(job.ledger);

    renderCheckpoints(job);
    renderDetails(job);
    renderHistory(job.history || []);
  }

  /** The job's time by bucket: a large stacked bar, and a legend with each bucket's seconds */
  function renderLedger(ledger) {
    const parts = ledgerParts(ledger);
    $("job-ledger").hidden = !parts;
    if (!parts) return;
    const bar = $("ledger-bar");
    if (!bar.firstChild) bar.append(...ledgerSegments());
    drawLedger(bar, ledger);
    const goodput = ledger.goodput || {};
    const caption = ["· wall time " + fmtDuration(ledger.wall_s)];
    if (isNum(ledger.gpu_seconds) && ledger.gpu_seconds > 0) caption.push(fmtCompact(ledger.gpu_seconds / 3600) + " GPU-hours");
    caption.push("goodput " + fmtPct(goodput.time) + " = scheduling " + fmtPct(goodput.scheduling) + " × runtime " + fmtPct(goodput.runtime));
    if (isNum(goodput.program)) caption.push("MFU " + fmtPct(goodput.program));
    setText($("ledger-caption"), caption.join(" · "));
    const items = parts.map(([bucket, seconds, share]) =>
      h(
        "li",
        { class: seconds > 0 ? null : "none", "data-bucket": bucket, title: BUCKETS[bucket] },
        h("span", { class: "swatch b-" + bucket }),
        h("span", { class: "name" }, bucket),
        h("span", { class: "secs" }, fmtDuration(seconds)),
        h("span", { class: "share" }, fmtPct(share)),
      ),
    );
    replaceChildren($("ledger-legend"), items);
  }

  function renderCheckpoints(job) {
    const uris = (job.checkpoints || (job.last_checkpoint ? [job.last_checkpoint] : [])).slice();
    setText($("ckpt-count"), uris.length ? "(" + fmtInt(uris.length) + ")" : "");
    const shown = uris.slice(-12).reverse();
    const items = shown.map((uri, i) => {
      const step = checkpointStep(uri);
      return h(
        "li",
        null,
        h("span", { class: "step" }, step == null ? "—" : "step " + fmtInt(step)),
        h("span", null, h("span", { class: "uri mono" }, uri), i === 0 ? h("span", { class: "newest" }, "newest") : null),
      );
    });
    if (uris.length > shown.length) items.push(h("li", { class: "muted" }, "", "+ " + fmtInt(uris.length - shown.length) + " older"));
    if (!items.length) items.push(h("li", { class: "muted" }, "", "No checkpoint yet."));
    replaceChildren($("job-checkpoints"), items);
  }

  function renderDetails(job) {
    const placement = Object.entries(job.placement || {}).map(([node, n]) => node + " × " + n);
    const params = Object.entries(job.sweep_params || {}).map(([k, v]) => k + " = " + JSON.stringify(v));
    const submission = submissionOf(job);
    const dashboard = dashboardJobUrl(page.info && page.info.dashboard, submission);
    const pairs = [
      ["Job id", h("span", { class: "mono" }, job.id)],
      ["Run", job.run || null],
      ["Ray Job", submission ? (dashboard ? h("a", { href: dashboard, target: "_blank", rel: "noopener noreferrer", class: "mono" }, submission) : h("span", { class: "mono" }, submission)) : null],
      ["Launched by", job.launched_by || null],
      ["Submitted", fmtDate(job.submitted_at)],
      ["Admitted", job.admitted_at ? fmtDate(job.admitted_at) : null],
      ["Started", job.started_at ? fmtDate(job.started_at) : null],
      ["Finished", job.finished_at ? fmtDate(job.finished_at) : null],
      ["Placement", placement.length ? placement.join(", ") : null],
      ["Sweep trial", params.length ? params.join(", ") : null],
      ["Last checkpoint", job.last_checkpoint ? h("span", { class: "mono" }, job.last_checkpoint) : null],
    ].filter(([, v]) => v != null);
    replaceChildren($("job-details"), pairs.flatMap(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
  }

  const HISTORY_SKIP = new Set(["time", "event"]);

  function historyDetail(entry) {
    return Object.entries(entry)
      .filter(([k, v]) => !HISTORY_SKIP.has(k) && v != null && v !== "")
      .map(([k, v]) => k.replace(/_/g, " ") + " " + (isNum(v) ? (Number.isInteger(v) ? fmtInt(v) : v.toFixed(2)) : typeof v === "object" ? JSON.stringify(v) : String(v)))
      .join(" · ");
  }

  /** 14:05:09, with the date under it when it was not today */
  function historyTime(t) {
    if (!isNum(t)) return h("time", null, "—");
    const d = new Date(t * 1000);
    const today = d.toDateString() === new Date().toDateString();
    return h("time", { title: fmtDate(t) }, hms(d), today ? null : h("span", { class: "sub" }, ymd(d)));
  }

  function renderHistory(history) {
    const items = history
      .slice(-50)
      .reverse()
      .map((entry) =>
        h(
          "li",
          { class: "ev-" + String(entry.event || "").replace(/[^a-z0-9-]/gi, "") },
          historyTime(entry.time),
          h("div", null, h("div", { class: "event" }, String(entry.event || "")), h("div", { class: "detail" }, historyDetail(entry))),
        ),
      );
    if (!items.length) items.push(h("li", { class: "muted" }, "", "No events yet."));
    replaceChildren($("job-history"), items);
  }

  function renderMissing(jobId) {
    setText($("job-name"), jobId);
    badge($("job-state"), "stopped", "unknown");
    const callout = $("job-callout");
    callout.hidden = false;
    callout.className = "callout warn";
    setText(callout, "The orchestrator service does not know this job (any more).");
    renderHealth(null);
  }

  // --- polling -------------------------------------------------------------------------------------------

  /** JSON from the API; with `allowMissing`, a 404 is null rather than an error. */
  async function getJSON(url, allowMissing) {
    const response = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
    if (response.status === 401) window.location.assign("login"); // no token, or one revoked: paste one
    if (allowMissing && response.status === 404) return null;
    if (!response.ok) throw new Error("HTTP " + response.status + " from " + url);
    return response.json();
  }

  async function tick() {
    if (page.busy) return;
    page.busy = true;
    page.again = false;
    clearTimeout(page.timer);
    try {
      const [info, reply] = await Promise.all([getJSON("api/info"), getJSON(queueUrl())]);
      page.info = info;
      page.jobs = reply.jobs || [];
      page.total = reply.total || 0;
      page.counts = reply.counts || {};
      if (!page.jobs.length && page.offset > 0 && page.total > 0) turnTo(page.offset); // fewer pages now
      renderInfo(info);
      renderQueue();
      if (detail.id) await pollJob();
      setLive(true);
    } catch (err) {
      console.warn("status page poll failed:", err);
      setLive(false, "cannot reach the orchestrator service · retrying");
    } finally {
      page.busy = false;
      page.timer = setTimeout(tick, page.again ? 0 : document.hidden ? HIDDEN_POLL_MS : POLL_MS);
    }
  }

  /** Ask the service now (the search, the state or the page changed), or as soon as the poll
   * on its way is back: its answer is for what was asked before */
  function refresh() {
    if (page.busy) page.again = true;
    else tick();
  }

  function start() {
    $("filter").addEventListener("input", (event) => {
      clearTimeout(page.typing);
      page.typing = setTimeout(() => {
        page.text = event.target.value.trim();
        page.offset = 0;
        refresh();
      }, SEARCH_DELAY_MS);
    });
    $("show-finished").addEventListener("change", (event) => {
      page.showFinished = event.target.checked;
      page.offset = 0;
      refresh();
    });
    $("page-prev").addEventListener("click", () => turnTo(page.offset - PAGE_SIZE));
    $("page-next").addEventListener("click", () => turnTo(page.offset + PAGE_SIZE));
    $("job-close").addEventListener("click", closeJob);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && detail.id && document.activeElement.tagName !== "INPUT") closeJob();
    });
    window.addEventListener("hashchange", onRoute);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) tick();
    });
    onRoute();
    tick();
  }

  start();
})();
