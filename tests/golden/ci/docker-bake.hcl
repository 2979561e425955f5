# stackpin ci matrix --format bake: one target per cell x variant.
# Prepare each context first: stackpin build CELL --variant V --prepare-only

group "default" {
  targets = ["synth-cpu-stable", "synth-cuda-stable", "synth-cuda-enhanced", "synth-dtk-stable", "synth-dtk-enhanced", "synth-rocm-stable"]
}

target "synth-cpu-stable" {
  context    = "build/context/synth-cpu-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-cpu:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-cpu"
    "io.stackpin.variant" = "stable"
  }
}

target "synth-cuda-stable" {
  context    = "build/context/synth-cuda-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-cuda:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-cuda"
    "io.stackpin.variant" = "stable"
  }
}

target "synth-cuda-enhanced" {
  context    = "build/context/synth-cuda-enhanced"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-cuda:enhanced"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-cuda"
    "io.stackpin.variant" = "enhanced"
  }
}

target "synth-dtk-stable" {
  context    = "build/context/synth-dtk-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-dtk:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-dtk"
    "io.stackpin.variant" = "stable"
  }
}

target "synth-dtk-enhanced" {
  context    = "build/context/synth-dtk-enhanced"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-dtk:enhanced"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-dtk"
    "io.stackpin.variant" = "enhanced"
  }
}

target "synth-rocm-stable" {
  context    = "build/context/synth-rocm-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/synth-rocm:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1700000000"
  }
  labels = {
    "io.stackpin.cell"    = "synth-rocm"
    "io.stackpin.variant" = "stable"
  }
}
