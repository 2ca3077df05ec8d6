/* memwall calculator, page side: builds the controls inside `root`, and on every change asks
   MemwallCalc (calculator_core.js) for the figures and the displayed text, then draws the memory
   bar and the table the same way memwall/widgets/calculator.py's render_html does. */
function memwallCalculatorUI(root, config) {
  "use strict";
  var catalog = config.catalog, start = config.defaults;

  function element(tag, attributes, text) {
    var node = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (key) { node.setAttribute(key, attributes[key]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function labelled(text, control) {
    var label = element("label", { "class": "mw-field" }, text + " ");
    label.appendChild(control);
    controlsBox.appendChild(label);
    return control;
  }
  function select(options, value) {  // options: [[label, value], ...]; "" stands for None
    var node = element("select");
    options.forEach(function (option) {
      var item = element("option", { value: option[1] === null ? "" : String(option[1]) }, option[0]);
      node.appendChild(item);
    });
    node.value = value === null ? "" : String(value);
    return node;
  }
  function pairs(names) { return names.map(function (name) { return [name, name]; }); }

  var controlsBox = element("div", { "class": "mw-controls" });
  root.appendChild(controlsBox);
  var model = labelled("model", select(pairs(Object.keys(catalog.models)), start.model));
  var gpu = labelled("GPU", select(pairs(Object.keys(catalog.hardware)), start.hardware));
  var dtype = labelled("weights", select(pairs(config.weight_dtypes), start.dtype));
  var kvDtype = labelled("KV dtype", select(config.kv_dtypes, start.kv_dtype));
  var context = labelled("context", element("input", { type: "number", min: "1", step: "1", value: String(start.context) }));
  var contextSlider = labelled("", element("input", { type: "range", min: "7", max: "17", step: "1" }));
  var users = labelled("users", element("input", { type: "number", min: "1", step: "1", value: String(start.batch) }));
  var usersSlider = labelled("", element("input", { type: "range", min: "0", max: "10", step: "1" }));
  var kvHeads = labelled("KV heads", element("select"));
  var out = element("div", { "class": "mw-calc-out" });
  root.appendChild(out);

  function currentSpec() { return catalog.models[model.value]; }
  function fillKvHeads(keep) {
    var spec = currentSpec(), choices = [["as published (" + spec.n_kv_heads + ")", ""]];
    for (var n = 1; n <= spec.n_heads; n++) {
      if (spec.n_heads % n === 0 && (spec.arch !== "gpt2" || n === spec.n_heads)) choices.push([String(n), String(n)]);
    }
    kvHeads.innerHTML = "";
    choices.forEach(function (c) { kvHeads.appendChild(element("option", { value: c[1] }, c[0])); });
    kvHeads.value = choices.some(function (c) { return c[1] === keep; }) ? keep : "";
  }
  function fitContext() {
    var top = currentSpec().max_context;
    context.max = String(top);
    contextSlider.max = String(Math.floor(Math.log2(top)));
    if (parseInt(context.value, 10) > top) context.value = String(top);
  }

  function render() {
    out.innerHTML = "";
    var f, text;
    try {
      f = MemwallCalc.figures(catalog, {
        model: model.value, hardware: gpu.value, dtype: dtype.value, kv_dtype: kvDtype.value || null,
        context: Number(context.value), batch: Number(users.value),
        kv_heads: kvHeads.value === "" ? null : Number(kvHeads.value)
      });
      text = MemwallCalc.displayed(f);
    } catch (error) {
      out.appendChild(element("div", { "class": "mw-error" }, error.message));
      return;
    }
    var bar = element("div", { "class": "mw-bar" }), colors = config.colors;
    var segments = [["weights", f.weight_fraction, colors.weights], ["KV cache", f.kv_fraction, colors.kv],
                    f.fits ? ["free", f.free_fraction, colors.free] : ["over", 1 - f.memory_fraction, colors.over]];
    segments.forEach(function (s) {
      bar.appendChild(element("div", { title: s[0], style: "width:" + (100 * s[1]).toFixed(4) + "%;background:" + s[2] }));
    });
    if (!f.fits) {
      bar.appendChild(element("div", { "class": "mw-limit", title: "GPU memory",
                                       style: "left:" + (100 * f.memory_fraction).toFixed(4) + "%" }));
    }
    out.appendChild(bar);
    var legend = element("div", { "class": "mw-legend" });
    [["\u25a0", colors.weights, " weights " + text.weights + "  "], ["\u25a0", colors.kv, " KV cache " + text.kv_total + "  "]]
      .forEach(function (item) {
        legend.appendChild(element("span", { style: "color:" + item[1] }, item[0]));
        legend.appendChild(document.createTextNode(item[2]));
      });
    legend.appendChild(document.createTextNode("of " + text.memory));
    out.appendChild(legend);
    var table = element("table", { "class": "mw-table" });
    config.rows.forEach(function (row) {
      var tr = element("tr");
      tr.appendChild(element("td", {}, row[0]));
      tr.appendChild(element("td", { "data-key": row[1] }, text[row[1]]));
      table.appendChild(tr);
    });
    out.appendChild(table);
  }

  model.addEventListener("change", function () { fillKvHeads(kvHeads.value); fitContext(); render(); });
  contextSlider.addEventListener("input", function () { context.value = String(Math.pow(2, Number(contextSlider.value))); render(); });
  usersSlider.addEventListener("input", function () { users.value = String(Math.pow(2, Number(usersSlider.value))); render(); });
  [gpu, dtype, kvDtype, kvHeads].forEach(function (c) { c.addEventListener("change", render); });
  [context, users].forEach(function (c) { c.addEventListener("input", render); });

  fillKvHeads(start.kv_heads === null ? "" : String(start.kv_heads));
  fitContext();
  contextSlider.value = String(Math.round(Math.log2(Number(context.value))));
  usersSlider.value = String(Math.round(Math.log2(Number(users.value))));
  render();
}
