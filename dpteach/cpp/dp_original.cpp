// dp_original.cpp: libtorch's data parallel replication before and after PR #20910, on any device.
//
// Compiled on first use by dpteach/cpp/__init__.py (torch.utils.cpp_extension.load_inline).
// Python sees four functions; the model is a torch::nn::Linear or a small Sequential built
// from the weights Python hands in, so every result compares exactly with a Python model:
//   single_step    the model on one device: the reference
//   clone_step     replicas from Module::clone(), as data_parallel made them: issue #19540
//   rewire_step    clone, then one ReduceAdd per parameter (replicate_grad_edges): PR #20910
//   member_handle  the PR's "Failed Attempt": why C++ could not assign into parameters_
// libtorch's own torch/nn/parallel/data_parallel.h pulls in CUDA headers, so ReduceAdd and
// replicate_grad_edges are written out here, following the PR.

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 and its Tensor casters; lighter than torch/python.h

#include <map>
#include <string>
#include <vector>

namespace py = pybind11;
using torch::Tensor;
using ModulePtr = std::shared_ptr<torch::nn::Module>;  // a Linear or a Sequential, as clone() returns it
using Result = std::map<std::string, Tensor>;  // a dict of tensors in Python; undefined -> None

namespace dpteach {

// ---------------------------------------------------------------------------------------------
// The fix, written again after PR #20910's (torch/nn/parallel/data_parallel.h); the differences are noted.

// Note [Replicating Modules] (abridged): replicating is 1) Module::clone() onto each device,
// 2) a gradient edge from every parameter X in every replica to the same X in the original,
// with ReduceAdd as the grad_fn. ReduceAdd can ONLY be used during the backward pass of
// data parallel: it sets up no history of its own.
// In 2019 the base class was torch::autograd::Function; PR #23269 renamed it Node in July 2019.
struct ReduceAdd : public torch::autograd::Node {
  explicit ReduceAdd(const torch::Device& destination_device)
      : destination_device_(destination_device) {}

  std::string name() const override { return "ReduceAdd"; }  // grad_fn.name() in Python; libtorch's: no override

  torch::autograd::variable_list apply(torch::autograd::variable_list&& inputs) override {
    // no double backward: under create_graph=True an incoming gradient can require grad (#21144)
    TORCH_CHECK(!torch::autograd::compute_requires_grad(inputs),
                "ReduceAdd can only be used during the backward pass of data parallel.");
    Tensor output;
    for (auto& input : inputs) {
      if (!input.defined()) continue;  // a replica whose forward did not use its copy (the PR assumed none)
      if (!output.defined()) output = torch::zeros_like(input, torch::TensorOptions(destination_device_));
      TORCH_CHECK(input.sizes() == output.sizes(),
                  "All inputs of ReduceAdd must have the same size, but got ", input.sizes(),
                  " and ", output.sizes());
      TORCH_CHECK(input.dtype() == output.dtype(),
                  "All inputs of ReduceAdd must have the same dtype, but got ", input.dtype(),
                  " and ", output.dtype());
      output.add_(input.to(destination_device_));  // TODO in the PR too: use nccl reduce
    }
    return {output};  // one output: the gradient for the original's AccumulateGrad
  }

 private:
  torch::Device destination_device_;
};

// One ReduceAdd per original parameter (and grad-requiring buffer); each replica's copy's gradient is one input of it.
// libtorch's version is a friend of Module and reads the replicas' parameters_, buffers_ and children_
// directly; the public accessors hand out Tensor handles to the same TensorImpls, and
// set_history changes the TensorImpl, so this needs no friendship. Recurses by child name, as
// libtorch's does.
void replicate_grad_edges(const torch::nn::Module& module,
                          const std::vector<std::shared_ptr<torch::nn::Module>>& replicas) {
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    auto grad_fn = c10::make_intrusive<ReduceAdd>(parameter.value().device());
    // the edge out: the original parameter's gradient accumulator (impl::gradient_edge)
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(parameter.value()));
    for (const auto& replica : replicas) {  // each call adds one input to grad_fn
      Tensor copy = replica->named_parameters(false)[parameter.key()];
      torch::autograd::set_history(copy, grad_fn);  // FIX (#20910): the copy's gradient now flows to grad_fn
    }
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    // a buffer that requires no grad (BatchNorm's running_mean) has no AccumulateGrad to lead to, and
    // set_history would make its copies require grad: only grad-requiring ones get an edge, as in libtorch
    if (!buffer.value().requires_grad()) continue;
    auto grad_fn = c10::make_intrusive<ReduceAdd>(buffer.value().device());
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(buffer.value()));
    for (const auto& replica : replicas) {
      Tensor copy = replica->named_buffers(false)[buffer.key()];
      torch::autograd::set_history(copy, grad_fn);  // FIX (#20910): likewise for a buffer
    }
  }
  for (const auto& child : module.named_children()) {
    std::vector<std::shared_ptr<torch::nn::Module>> child_replicas;
    for (const auto& replica : replicas) child_replicas.push_back(replica->named_children()[child.key()]);
    replicate_grad_edges(*child.value(), child_replicas);
  }
}

// ---------------------------------------------------------------------------------------------
// The model, the replicas and one data parallel step.

torch::nn::Linear make_linear(const Tensor& weight, const Tensor& bias) {
  torch::nn::Linear linear(weight.size(1), weight.size(0));
  torch::NoGradGuard no_grad;
  linear->weight.copy_(weight);  // Python's weights, so the results compare exactly
  linear->bias.copy_(bias);
  return linear;
}

// arch is {"Linear"} or {"Sequential", "Linear", "ReLU", ...}; params are [W0, b0, W1, b1, ...].
ModulePtr make_model(const std::vector<std::string>& arch, const std::vector<Tensor>& params,
                     const torch::Device& device) {
  TORCH_CHECK(!arch.empty() && !params.empty(), "make_model needs an architecture and its weights");
  size_t next = 0;
  auto linear = [&] {
    TORCH_CHECK(next + 1 < params.size(), "too few weights for the architecture");
    next += 2;
    return make_linear(params[next - 2], params[next - 1]);
  };
  ModulePtr model;
  if (arch[0] == "Linear") {
    model = linear().ptr();
  } else {
    torch::nn::Sequential sequential;
    for (size_t i = 1; i < arch.size(); ++i) {
      if (arch[i] == "Linear") sequential->push_back(linear());
      else if (arch[i] == "ReLU") sequential->push_back(torch::nn::ReLU());
      else TORCH_CHECK(false, "unknown layer ", arch[i], " (Linear and ReLU are built here)");
    }
    model = sequential.ptr();
  }
  TORCH_CHECK(next == params.size(), "more weights than the architecture has parameters");
  model->to(device, params[0].scalar_type());
  return model;
}

Tensor forward(const ModulePtr& module, const Tensor& x) {  // Module itself has no forward()
  if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module)) return linear->forward(x);
  return std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module)->forward(x);
}

// Cloneable::clone(device): reset() registers fresh leaf parameters; set_data copies the values in under NoGradGuard.
std::vector<ModulePtr> clone_replicas(const ModulePtr& model, const std::vector<torch::Device>& devices) {
  std::vector<ModulePtr> replicas;
  for (const auto& device : devices) {
    replicas.push_back(model->clone(device));  // BROKEN (#19540): fresh leaves, no gradient edge back
  }
  return replicas;
}

// Scatter x over the replicas, run each on its chunk, gather on devices[0]; loss = mean(out^2).
std::pair<Tensor, Tensor> step(const std::vector<ModulePtr>& replicas, const Tensor& x,
                               const std::vector<torch::Device>& devices) {
  auto chunks = x.chunk(static_cast<int64_t>(replicas.size()), 0);
  TORCH_CHECK(chunks.size() == replicas.size(), "x has ", x.size(0), " rows: too few for ",
              replicas.size(), " replicas");
  std::vector<Tensor> outputs;
  for (size_t i = 0; i < replicas.size(); ++i) {  // in turn; libtorch's parallel_apply uses at::parallel_for
    outputs.push_back(forward(replicas[i], chunks[i].to(devices[i])).to(devices[0]));
  }
  Tensor output = torch::cat(outputs);
  Tensor loss = output.pow(2).mean();
  loss.backward();  // the GIL is released around every function that gets here
  return {output, loss.detach()};  // output keeps its (used) graph: Python can walk grad_fn
}

// The tensors and (leaf) gradients of a module, under prefix; a non-leaf's .grad is never filled.
void record(Result& result, const std::string& prefix, const ModulePtr& module) {
  for (const auto& p : module->named_parameters()) {
    result["param/" + prefix + "/" + p.key()] = p.value();
    result["grad/" + prefix + "/" + p.key()] = p.value().is_leaf() ? p.value().grad() : Tensor();
  }
}

std::vector<torch::Device> as_devices(const std::vector<std::string>& names) {
  std::vector<torch::Device> devices(names.begin(), names.end());
  TORCH_CHECK(!devices.empty(), "devices is empty: give at least one, e.g. ['cpu', 'cpu']");
  return devices;
}

Result single_step(const std::vector<std::string>& arch, const std::vector<Tensor>& params,
                   const Tensor& x, const std::string& device) {
  ModulePtr model = make_model(arch, params, torch::Device(device));
  auto [output, loss] = step({model}, x, {torch::Device(device)});
  Result result{{"output", output}, {"loss", loss}};
  record(result, "original", model);
  return result;
}

Result data_parallel_step(const std::vector<std::string>& arch, const std::vector<Tensor>& params,
                          const Tensor& x, const std::vector<std::string>& device_names, bool rewire) {
  auto devices = as_devices(device_names);
  ModulePtr model = make_model(arch, params, devices[0]);
  std::vector<ModulePtr> replicas = clone_replicas(model, devices);
  if (rewire) replicate_grad_edges(*model, replicas);  // the whole of the fix
  auto [output, loss] = step(replicas, x, devices);
  Result result{{"output", output}, {"loss", loss}};
  record(result, "original", model);
  for (size_t i = 0; i < replicas.size(); ++i) record(result, "replica" + std::to_string(i), replicas[i]);
  return result;
}

Result clone_step(const std::vector<std::string>& arch, const std::vector<Tensor>& params,
                  const Tensor& x, const std::vector<std::string>& devices) {
  return data_parallel_step(arch, params, x, devices, /*rewire=*/false);
}

Result rewire_step(const std::vector<std::string>& arch, const std::vector<Tensor>& params,
                   const Tensor& x, const std::vector<std::string>& devices) {
  return data_parallel_step(arch, params, x, devices, /*rewire=*/true);
}

// ---------------------------------------------------------------------------------------------
// The PR's "Failed Attempt": Linear.weight and Linear.parameters_["weight"] are two Tensor
// handles to one TensorImpl. Python's replicate.py reassigns the registry entry; in C++ that
// changes the registry alone, and forward() keeps reading the member.

// parameters_ is protected: a derived class may name it, and the member pointer it forms
// works on any Module (the PR was a friend of Module instead).
struct Registry : torch::nn::Module {
  static torch::OrderedDict<std::string, Tensor>& of(torch::nn::Module& module) {
    return module.*(&Registry::parameters_);
  }
};

py::dict member_handle(const Tensor& weight, const Tensor& bias, const Tensor& x) {
  auto replica = std::dynamic_pointer_cast<torch::nn::LinearImpl>(make_linear(weight, bias)->clone());
  py::dict out;
  out["shared_before"] = replica->named_parameters()["weight"].is_same(replica->weight);

  Tensor stand_in = torch::zeros(replica->weight.sizes(), replica->weight.options());  // zeros: outputs tell which was read
  std::string error;
  try {
    replica->register_parameter("weight", stand_in);  // the public way in: refused
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  out["register_parameter_error"] = error;

  Registry::of(*replica)["weight"] = stand_in;  // the Python approach: assign into the registry
  out["registry_weight"] = replica->named_parameters()["weight"];
  out["member_weight"] = replica->weight;  // still the old TensorImpl
  out["shared_after"] = replica->named_parameters()["weight"].is_same(replica->weight);
  out["forward"] = replica->forward(x).detach();
  out["forward_with_member"] = torch::nn::functional::linear(x, replica->weight, replica->bias).detach();
  out["forward_with_registry"] = torch::nn::functional::linear(x, stand_in, replica->bias).detach();

  // What the fix does instead: set_history on a *copy* of the handle reaches the member too,
  // because the gradient edge lives in the TensorImpl both handles share.
  auto fresh = std::dynamic_pointer_cast<torch::nn::LinearImpl>(make_linear(weight, bias)->clone());
  Tensor handle = fresh->named_parameters()["weight"];
  torch::autograd::set_history(handle, c10::make_intrusive<ReduceAdd>(handle.device()));
  out["member_grad_fn_after_set_history"] = fresh->weight.grad_fn() ? fresh->weight.grad_fn()->name() : "";
  return out;
}

}  // namespace dpteach

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "libtorch's Module::clone() replicas and PR #20910's ReduceAdd fix (dpteach chapter 10)";
  // once torch is imported, backward() runs on PythonEngine, whose execute() raises if this thread
  // holds the GIL: release it around every function that calls backward()
  auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("single_step", &dpteach::single_step, "one device: the reference", no_gil);
  m.def("clone_step", &dpteach::clone_step, "Module::clone() replicas (issue #19540)", no_gil);
  m.def("rewire_step", &dpteach::rewire_step, "clone, then ReduceAdd edges (PR #20910)", no_gil);
  m.def("member_handle", &dpteach::member_handle, "assigning into parameters_ vs Linear::weight");
}
