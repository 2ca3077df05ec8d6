/* memwall "How big is the cache?" calculator: the arithmetic, ported line by line from
   memwall/cost.py and memwall/specs.py so that a page without a Python kernel shows the same
   numbers. tests/test_calculator.py runs this file under node over a grid of inputs and checks
   every figure and every displayed string against the Python. Change both together.
   No DOM here: these functions take the catalog (JSON written by static_calculator.py) and plain
   inputs, and return plain objects. */
var MemwallCalc = (function () {
  "use strict";

  function has(object, key) { return Object.prototype.hasOwnProperty.call(object, key); }

  // ---- dtypes (cost.bytes_per_element, cost.compute_dtype_for) ----
  function bytesPerElement(catalog, dtype) {
    var table = catalog.dtype_bytes;
    if (has(table, dtype)) return table[dtype];
    var text = String(dtype), at = text.indexOf("-g");
    var base = at < 0 ? text : text.slice(0, at), group = at < 0 ? "" : text.slice(at + 2);
    if (catalog.grouped_bases.indexOf(base) >= 0 && /^[0-9]+$/.test(group) && parseInt(group, 10) > 0) {
      return table[base] + catalog.group_metadata_bytes / parseInt(group, 10);
    }
    throw new Error("Unknown dtype " + JSON.stringify(dtype) + "; choose from " + Object.keys(table).join(", ") +
                    ", or a group-wise " + catalog.grouped_bases.join("/") + " such as 'int4-g128'.");
  }

  function computeDtypeFor(catalog, weightDtype) {
    bytesPerElement(catalog, weightDtype);
    return catalog.float_compute_dtypes.indexOf(weightDtype) >= 0 ? weightDtype : "bf16";
  }

  // ---- parameter counts (specs.ModelSpec) ----
  function isGpt2(s) { return s.arch === "gpt2"; }
  function embeddingParams(s) { return s.vocab_size * s.d_model + (isGpt2(s) ? s.max_context * s.d_model : 0); }
  function lmHeadParams(s) { return s.vocab_size * s.d_model; }
  function attentionParamsPerLayer(s) {
    var qOut = s.n_heads * s.head_dim, kvOut = s.n_kv_heads * s.head_dim;
    var weights = s.d_model * (qOut + 2 * kvOut) + qOut * s.d_model;
    if (isGpt2(s)) return weights + (qOut + 2 * kvOut) + s.d_model;
    return weights + (s.qkv_bias ? (qOut + 2 * kvOut) : 0);
  }
  function ffnParamsPerExpert(s) {
    if (isGpt2(s)) return 2 * s.d_model * s.d_ff + s.d_ff + s.d_model;
    return 3 * s.d_model * s.d_ff;
  }
  function routerParamsPerLayer(s) { return s.n_experts > 1 ? s.d_model * s.n_experts : 0; }
  function normParamsPerLayer(s) { return 2 * (isGpt2(s) ? 2 * s.d_model : s.d_model); }
  function finalNormParams(s) { return isGpt2(s) ? 2 * s.d_model : s.d_model; }
  function countParams(s, expertsPerLayer) {
    var perLayer = attentionParamsPerLayer(s) + normParamsPerLayer(s) + routerParamsPerLayer(s) +
                   expertsPerLayer * ffnParamsPerExpert(s);
    var head = s.tied_embeddings ? 0 : lmHeadParams(s);
    return embeddingParams(s) + s.n_layers * perLayer + finalNormParams(s) + head;
  }
  function nParams(s) { return countParams(s, s.n_experts); }
  function nParamsActive(s) { return countParams(s, s.n_active_experts); }

  function withKvHeads(s, nKvHeads) {
    if (s.n_heads % nKvHeads) {
      throw new Error(s.name + ": n_heads (" + s.n_heads + ") must be a multiple of n_kv_heads (" + nKvHeads + ").");
    }
    if (isGpt2(s) && nKvHeads !== s.n_heads) throw new Error(s.name + ": gpt2 has plain multi-head attention.");
    var copy = {};
    Object.keys(s).forEach(function (key) { copy[key] = s[key]; });
    copy.n_kv_heads = nKvHeads;
    copy.name = s.name + (nKvHeads !== s.n_kv_heads ? "-kv" + nKvHeads : "");
    return copy;
  }

  // ---- input checks (cost._count, cost._check_context) ----
  function count(name, value, minimum) {
    if (typeof value !== "number" || !Number.isInteger(value)) {
      throw new Error(name + " must be an integer, got " + JSON.stringify(value) + ".");
    }
    if (value < minimum) throw new Error(name + " must be >= " + minimum + ", got " + value + ".");
    return value;
  }
  function checkContext(s, tokens) {
    if (tokens > s.max_context) {
      throw new Error("A context of " + tokens + " tokens exceeds " + s.name + "'s maximum of " + s.max_context +
                      "; choose a context between 1 and " + s.max_context + ".");
    }
  }

  // ---- bytes (cost.weight_bytes, cost.kv_bytes_per_token, cost.kv_cache_bytes) ----
  function weightStorageBytes(catalog, s, dtype) { return nParams(s) * bytesPerElement(catalog, dtype); }
  function expectedExpertsTouched(s, tokens) {
    if (s.n_experts === 1) return 1.0;
    var missOne = 1 - s.n_active_experts / s.n_experts;
    return s.n_experts * (1 - Math.pow(missOne, tokens));
  }
  function weightBytes(catalog, s, dtype, tokens) {
    var untouched = s.n_experts - expectedExpertsTouched(s, tokens);
    var params = nParams(s) - s.n_layers * untouched * ffnParamsPerExpert(s);
    return params * bytesPerElement(catalog, dtype);
  }
  function kvBytesPerToken(catalog, s, kvDtype) {
    return 2 * s.n_layers * s.n_kv_heads * s.head_dim * bytesPerElement(catalog, kvDtype);
  }
  function kvCacheBytes(catalog, s, context, batch, kvDtype) {
    count("context", context, 0);
    count("batch", batch, 1);
    checkContext(s, context);
    return batch * context * kvBytesPerToken(catalog, s, kvDtype);
  }

  // ---- one step (cost.step) ----
  function matmulParamsPerToken(s) {
    var perLayer = attentionParamsPerLayer(s) + routerParamsPerLayer(s) + s.n_active_experts * ffnParamsPerExpert(s);
    return s.n_layers * perLayer + lmHeadParams(s);
  }
  function activationElementsPerToken(s) {
    var qOut = s.n_heads * s.head_dim, kvOut = s.n_kv_heads * s.head_dim;
    var attention = (s.d_model + qOut + 2 * kvOut) + (qOut + s.d_model);
    var ffn = isGpt2(s) ? (s.d_model + s.d_ff) + (s.d_ff + s.d_model)
                        : 2 * (s.d_model + s.d_ff) + (s.d_ff + s.d_model);
    var perLayer = attention + s.n_active_experts * ffn;
    return s.n_layers * perLayer + s.d_model + s.vocab_size;
  }
  function step(catalog, s, batch, context, newTokens, weightDtype, kvDtype) {
    count("batch", batch, 1); count("context", context, 0); count("new_tokens", newTokens, 1);
    checkContext(s, context + newTokens);
    var computeDtype = computeDtypeFor(catalog, weightDtype);
    kvDtype = kvDtype || computeDtype;
    var tokens = batch * newTokens;
    var attended = batch * (newTokens * context + Math.floor(newTokens * (newTokens + 1) / 2));
    var attentionFlops = 4 * s.n_layers * s.n_heads * s.head_dim * attended;
    var cost = {
      batch: batch, context: context, new_tokens: newTokens, kv_dtype: kvDtype, compute_dtype: computeDtype,
      weight_bytes: weightBytes(catalog, s, weightDtype, tokens),
      kv_bytes: batch * (context + newTokens) * kvBytesPerToken(catalog, s, kvDtype),
      activation_bytes: tokens * activationElementsPerToken(s) * bytesPerElement(catalog, computeDtype),
      flops: 2 * tokens * matmulParamsPerToken(s) + attentionFlops,
      attention_flops: attentionFlops
    };
    cost.total_bytes = cost.weight_bytes + cost.kv_bytes + cost.activation_bytes;
    return cost;
  }
  // cost.ledger_rows + cost.row_floor: weight matmuls and attention, each on its own roofline
  function rowFloor(flops, bytes, hw, dtype) {
    var memoryS = bytes / hw.memory_bandwidth, computeS = flops / peakFlops(hw, dtype);
    return { flops: flops, bytes: bytes, arithmetic_intensity: bytes ? flops / bytes : Infinity,
             memory_time_s: memoryS, compute_time_s: computeS, time_s: Math.max(memoryS, computeS),
             bound: memoryS >= computeS ? "memory" : "compute" };
  }
  function ledgerRows(cost, hw) {
    return {
      matmul: rowFloor(cost.flops - cost.attention_flops, cost.weight_bytes + cost.activation_bytes, hw, cost.compute_dtype),
      attention: rowFloor(cost.attention_flops, cost.kv_bytes, hw, cost.compute_dtype)
    };
  }

  // ---- the roofline (cost.peak_flops, cost.memory_budget) ----
  var FLOP_FALLBACKS = { bf16: ["fp16", "fp32"], fp16: ["bf16", "fp32"] };
  function peakFlops(hw, dtype) {
    if (has(hw.peak_flops, dtype)) return hw.peak_flops[dtype];
    var fallbacks = FLOP_FALLBACKS[dtype] || [];
    for (var i = 0; i < fallbacks.length; i++) {
      if (has(hw.peak_flops, fallbacks[i])) return hw.peak_flops[fallbacks[i]];
    }
    throw new Error(hw.name + " has no peak FLOP/s for " + JSON.stringify(dtype) + "; choose from " +
                    Object.keys(hw.peak_flops).join(", ") + ".");
  }
  function memoryBudget(catalog, s, hw, context, weightDtype, kvDtype) {
    count("context", context, 1);
    kvDtype = kvDtype || computeDtypeFor(catalog, weightDtype);
    var free = hw.memory_bytes - weightStorageBytes(catalog, s, weightDtype);
    if (free <= 0) return 0;
    return Math.floor(free / kvCacheBytes(catalog, s, context, 1, kvDtype));
  }

  function lookup(table, name, what) {
    var key = String(name).trim().toLowerCase();
    if (!has(table, key)) {
      throw new Error("Unknown " + what + " " + JSON.stringify(name) + "; choose from " + Object.keys(table).join(", ") + ".");
    }
    return table[key];
  }

  // ---- cost.calc, plus what the calculator draws (widgets/calculator.figures) ----
  function figures(catalog, inputs) {
    var published = lookup(catalog.models, inputs.model, "model");
    var hw = lookup(catalog.hardware, inputs.hardware, "hardware");
    var dtype = inputs.dtype || "bf16";
    var spec = published;
    if (inputs.kv_heads !== null && inputs.kv_heads !== undefined) {
      spec = withKvHeads(published, count("kv_heads", inputs.kv_heads, 1));
    }
    var context = count("context", inputs.context, 1), batch = count("batch", inputs.batch, 1);
    var cost = step(catalog, spec, batch, context - 1, 1, dtype, inputs.kv_dtype || null);
    var memS = cost.total_bytes / hw.memory_bandwidth;
    var computeS = cost.flops / peakFlops(hw, cost.compute_dtype);
    var seconds = Math.max(memS, computeS);
    var rows = ledgerRows(cost, hw);
    var weightStorage = weightStorageBytes(catalog, spec, dtype);
    var kvTotal = kvCacheBytes(catalog, spec, context, batch, cost.kv_dtype);
    var needed = weightStorage + kvTotal;
    var scale = Math.max(hw.memory_bytes, needed);
    var f = {
      model: spec.name, hardware: hw.name, dtype: dtype, kv_dtype: cost.kv_dtype, compute_dtype: cost.compute_dtype,
      context: context, batch: batch, n_kv_heads: spec.n_kv_heads,
      n_params: nParams(spec), n_params_active: nParamsActive(spec),
      weight_bytes: cost.weight_bytes,
      weight_storage_bytes: weightStorage,
      kv_bytes_per_token: kvBytesPerToken(catalog, spec, cost.kv_dtype),
      kv_bytes_per_user: kvCacheBytes(catalog, spec, context, 1, cost.kv_dtype),
      kv_bytes_total: kvTotal,
      activation_bytes: cost.activation_bytes,
      bytes_per_step: cost.total_bytes,
      flops_per_step: cost.flops,
      arithmetic_intensity: cost.flops / cost.total_bytes,
      ridge_point: peakFlops(hw, cost.compute_dtype) / hw.memory_bandwidth,
      bound: rows.matmul.bound === rows.attention.bound ? rows.matmul.bound : "mixed",
      memory_bandwidth: hw.memory_bandwidth,
      peak_flops: peakFlops(hw, cost.compute_dtype),
      memory_time_s: memS,
      compute_time_s: computeS,
      step_time_s: seconds,
      tokens_per_s_per_user: cost.new_tokens / seconds,
      tokens_per_s_total: (cost.batch * cost.new_tokens) / seconds,
      memory_bytes: hw.memory_bytes,
      memory_needed_bytes: needed,
      fits: needed <= hw.memory_bytes,
      max_users: memoryBudget(catalog, spec, hw, context, dtype, cost.kv_dtype),
      sequential_step_time_s: rows.matmul.time_s + rows.attention.time_s,
      // what the calculator adds
      n_heads: spec.n_heads,
      n_kv_heads_published: published.n_kv_heads,
      attention: spec.n_kv_heads === spec.n_heads ? "MHA" : (spec.n_kv_heads === 1 ? "MQA" : "GQA"),
      mha_kv_ratio: spec.n_heads / spec.n_kv_heads,
      free_bytes: Math.max(0, hw.memory_bytes - needed),
      weight_fraction: weightStorage / scale,
      kv_fraction: kvTotal / scale,
      free_fraction: Math.max(0, hw.memory_bytes - needed) / scale,
      memory_fraction: hw.memory_bytes / scale
    };
    ["matmul", "attention"].forEach(function (name) {
      Object.keys(rows[name]).forEach(function (key) { f[name + "_" + key] = rows[name][key]; });
    });
    return f;
  }

  // ---- displayed text (widgets/calculator.displayed): the same rounding as the Python ----
  function roundTo(x, decimals) { var p = Math.pow(10, decimals); return Math.floor(x * p + 0.5) / p; }
  function groupThousands(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function formatNumber(x) {
    if (x === 0) return "0";
    if (x >= 1000) return groupThousands(Math.floor(x + 0.5));
    var decimals = x >= 100 ? 0 : x >= 10 ? 1 : x >= 1 ? 2 : 3;
    return roundTo(x, decimals).toFixed(decimals);
  }
  var BYTE_UNITS = [[1e12, "TB"], [1e9, "GB"], [1e6, "MB"], [1e3, "kB"]];
  function formatBytes(b) {
    for (var i = 0; i < BYTE_UNITS.length; i++) {
      if (b >= BYTE_UNITS[i][0]) return formatNumber(b / BYTE_UNITS[i][0]) + " " + BYTE_UNITS[i][1];
    }
    return formatNumber(b) + " B";
  }
  function displayed(f) {
    return {
      attention: f.attention + ": " + f.n_kv_heads + " KV head" + (f.n_kv_heads === 1 ? "" : "s") + " for " +
                 f.n_heads + " query heads",
      mha_kv_ratio: formatNumber(f.mha_kv_ratio) + "\u00d7",
      weights: formatBytes(f.weight_storage_bytes),
      kv_per_token: formatNumber(f.kv_bytes_per_token / 1024) + " KiB",
      kv_per_user: formatBytes(f.kv_bytes_per_user),
      kv_total: formatBytes(f.kv_bytes_total),
      needed: formatBytes(f.memory_needed_bytes),
      memory: formatBytes(f.memory_bytes),
      free: f.fits ? formatBytes(f.free_bytes) : "short by " + formatBytes(f.memory_needed_bytes - f.memory_bytes),
      max_users: groupThousands(f.max_users),
      tokens_per_s_per_user: formatNumber(f.tokens_per_s_per_user),
      tokens_per_s_total: formatNumber(f.tokens_per_s_total),
      step_time: formatNumber(f.step_time_s * 1000) + " ms",
      bound: f.bound !== "mixed" ? f.bound
                                 : "matmuls: " + f.matmul_bound + ", attention: " + f.attention_bound
    };
  }

  return { figures: figures, displayed: displayed, formatNumber: formatNumber, formatBytes: formatBytes,
           bytesPerElement: bytesPerElement, nParams: nParams };
})();
/* END memwall-calc-core */
