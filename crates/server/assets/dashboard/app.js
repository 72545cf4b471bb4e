// Pando's live dashboard: polls /dashboard/data once a second and draws
// the seconds the server kept (the last hour) with uPlot. Seconds whose
// latency stood out are shaded red on every chart, seconds where something
// else stood out (I/O, commits, connections, replication, index builds)
// get an amber mark; the table below lines them up.
(function () {
  "use strict";
  var KINDS = ["search", "bind", "compare", "add", "delete", "modify", "moddn", "extended"];
  var COLORS = { search: "#1d3557", bind: "#2a9d8f", compare: "#8d99ae", add: "#e9c46a",
    "delete": "#e76f51", modify: "#f4a261", moddn: "#9b5de5", extended: "#6c757d" };
  var KEEP = 3600;
  var state = { seconds: [], last: 0, window: 300, polls: 0, errors: 0, charts: [], selected: null };
  window.pandoDashboard = state;

  function op(s, kind, field) {
    var o = s.ops[kind];
    return o ? o[field] : null;
  }
  function sumOps(s) {
    var n = 0;
    for (var k in s.ops) n += s.ops[k].count;
    return n;
  }
  function maxOf(list, f) {
    var m = null;
    list.forEach(function (x) { var v = f(x); if (v !== null && (m === null || v > m)) m = v; });
    return m;
  }

  // Each chart: a title, its series (label, colour, value of a second), a log scale or not.
  var CHARTS = [
    { id: "ops", title: "Operations per second, by type", series: KINDS.map(function (k) {
      return { label: k, stroke: COLORS[k], value: function (s) { return op(s, k, "count"); } };
    }) },
    { id: "p99", title: "Latency p99 (ms, log scale)", log: true, series: KINDS.map(function (k) {
      return { label: k, stroke: COLORS[k], value: function (s) { return op(s, k, "p99"); } };
    }) },
    { id: "max", title: "Latency maximum (ms, log scale)", log: true, series: KINDS.map(function (k) {
      return { label: k, stroke: COLORS[k], value: function (s) { return op(s, k, "max"); } };
    }) },
    { id: "conns", title: "Connections", series: [
      { label: "open", stroke: "#1d3557", value: function (s) { return s.conns; } },
      { label: "opened/s", stroke: "#e76f51", value: function (s) { return s.conns_opened; } }] },
    { id: "net", title: "Network (KB/s)", series: [
      { label: "in", stroke: "#2a9d8f", value: function (s) { return s.bytes_in / 1024; } },
      { label: "out", stroke: "#1d3557", value: function (s) { return s.bytes_out / 1024; } }] },
    { id: "cpu", title: "CPU (% of a core) and store I/O (KB per operation)", series: [
      { label: "CPU %", stroke: "#e63946", value: function (s) { return s.cpu; } },
      { label: "I/O KB/op", stroke: "#457b9d", value: function (s) { return s.io_per_op / 1024; } }] },
    { id: "writer", title: "Writer: batch size and commit time (ms)", series: [
      { label: "batch size", stroke: "#f4a261", value: function (s) { return s.batches ? s.batch_size : null; } },
      { label: "commit ms", stroke: "#9b5de5", value: function (s) { return s.batches ? s.commit_ms : null; } }] },
    { id: "repl", title: "Replication: consumers' delay (ms), changes applied and conflicts per second", series: [
      { label: "delay ms", stroke: "#1d3557", value: function (s) { return maxOf(s.consumers, function (c) { return c.delay_ms; }); } },
      { label: "applied", stroke: "#2a9d8f", value: function (s) { return s.consumers.length ? s.consumers.reduce(function (a, c) { return a + c.applied; }, 0) : null; } },
      { label: "conflicts", stroke: "#e63946", value: function (s) { return s.consumers.length ? s.consumers.reduce(function (a, c) { return a + c.conflicts; }, 0) : null; } }] }
  ];

  function visible() {
    var from = state.last - state.window;
    return state.seconds.filter(function (s) { return s.t > from; });
  }

  // Red bands for outlier seconds, amber marks for seconds with events.
  function marks(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    visible().forEach(function (s) {
      if (!s.outliers.length && !s.events.length) return;
      var x = u.valToPos(s.t, "x", true);
      var w = Math.max(3, Math.abs(u.valToPos(s.t + 0.5, "x", true) - u.valToPos(s.t - 0.5, "x", true)));
      ctx.save();
      if (s.outliers.length) {
        ctx.fillStyle = "rgba(230, 57, 70, 0.25)";
        ctx.fillRect(x - w / 2, top, w, h);
      }
      if (s.events.length) {
        ctx.fillStyle = "rgba(244, 162, 97, 0.9)";
        ctx.fillRect(x - w / 2, top, w, 6);
      }
      if (state.selected === s.t) {
        ctx.strokeStyle = "#000";
        ctx.strokeRect(x - w / 2, top, w, h);
      }
      ctx.restore();
    });
  }

  function make(c) {
    var box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + c.id;
    var h = document.createElement("h2");
    h.textContent = c.title;
    box.appendChild(h);
    document.getElementById("charts").appendChild(box);
    var opts = {
      width: Math.max(520, box.clientWidth - 14), height: 200,
      series: [{}].concat(c.series.map(function (s) {
        return { label: s.label, stroke: s.stroke, width: 1.5, spanGaps: false };
      })),
      scales: { x: { time: true }, y: c.log ? { distr: 3 } : {} },
      axes: [{}, { size: 56 }],
      hooks: { draw: [marks], setCursor: [function (u) {
        if (u.cursor.idx !== null && u.cursor.idx !== undefined && u.data[0][u.cursor.idx] !== undefined) {
          hover = u.data[0][u.cursor.idx];
        }
      }] }
    };
    var data = [[]].concat(c.series.map(function () { return []; }));
    var plot = new uPlot(opts, data, box);
    plot.over.addEventListener("click", function () { if (hover !== null) select(hover); });
    state.charts.push({ spec: c, plot: plot });
  }
  var hover = null;

  function redraw() {
    var shown = visible();
    var xs = shown.map(function (s) { return s.t; });
    state.charts.forEach(function (ch) {
      var data = [xs].concat(ch.spec.series.map(function (ser) {
        return shown.map(function (s) {
          var v = ser.value(s);
          return (v === null || v === undefined || (ch.spec.log && v <= 0)) ? null : v;
        });
      }));
      ch.plot.setData(data);
    });
  }

  function time(t) {
    return new Date(t * 1000).toISOString().substr(11, 8) + "Z";
  }
  function text(el, s) { el.textContent = s; return el; }
  function cell(tr, content) {
    var td = document.createElement("td");
    if (typeof content === "string") td.textContent = content; else td.appendChild(content);
    tr.appendChild(td);
    return td;
  }
  function lines(list) {
    var pre = document.createElement("pre");
    pre.textContent = list.length ? list.join("\n") : "—";
    return pre;
  }
  function slowLines(s) {
    return s.slowest.map(function (o) { return o.ms.toFixed(1) + " ms  " + o.line; });
  }

  function table() {
    var body = document.querySelector("#outliers tbody");
    var rows = state.seconds.filter(function (s) { return s.outliers.length; }).slice(-50).reverse();
    body.textContent = "";
    rows.forEach(function (s) {
      var tr = document.createElement("tr");
      tr.className = "outlier" + (state.selected === s.t ? " selected" : "");
      tr.dataset.t = s.t;
      cell(tr, time(s.t));
      cell(tr, lines(s.outliers));
      cell(tr, lines(s.events.length ? s.events : ["nothing else stood out"]));
      cell(tr, lines(slowLines(s)));
      tr.addEventListener("click", function () { select(s.t); });
      body.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr");
      cell(tr, "no slow second in the last hour").colSpan = 4;
      body.appendChild(tr);
    }
  }

  function select(t) {
    state.selected = t;
    var s = state.seconds.filter(function (x) { return x.t === t; })[0];
    var box = document.getElementById("second");
    box.textContent = "";
    if (!s) return;
    text(document.getElementById("second-title"), "The second ending " + time(t) + ": " + sumOps(s) + " operations");
    box.appendChild(lines(slowLines(s).concat(s.events.length ? ["", "also: " + s.events.join("; ")] : [])));
    table();
    state.charts.forEach(function (ch) { ch.plot.redraw(false); });
  }

  function header() {
    var s = state.seconds[state.seconds.length - 1];
    var now = document.getElementById("now");
    now.textContent = "";
    if (!s) return;
    [["ops/s", sumOps(s)], ["search p99", (op(s, "search", "p99") || 0).toFixed(2) + " ms"],
     ["connections", s.conns], ["CPU", s.cpu.toFixed(0) + "%"]].forEach(function (kv) {
      var span = document.createElement("span");
      span.textContent = kv[0] + " " + kv[1];
      now.appendChild(span);
    });
  }

  function poll() {
    fetch("/dashboard/data?since=" + state.last, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (d) {
        d.seconds.forEach(function (s) { state.seconds.push(s); state.last = s.t; });
        if (state.seconds.length > KEEP) state.seconds.splice(0, state.seconds.length - KEEP);
        state.polls++;
        text(document.getElementById("status"), "live, " + state.seconds.length + " s kept" +
          (state.errors ? " (" + state.errors + " failed polls)" : ""));
        header();
        redraw();
        table();
      })
      .catch(function (e) {
        state.errors++;
        text(document.getElementById("status"), "no answer from the server: " + e.message);
      });
  }

  document.querySelectorAll("#windows button").forEach(function (b) {
    b.addEventListener("click", function () {
      state.window = Number(b.dataset.secs);
      document.querySelectorAll("#windows button").forEach(function (x) { x.className = x === b ? "on" : ""; });
      redraw();
    });
  });
  CHARTS.forEach(make);
  poll();
  setInterval(poll, 1000);
})();
