# stackpin ci matrix --format bake: one target per cell x variant.
# Prepare each context first: stackpin build CELL --variant V --prepare-only

group "default" {
  targets = ["cpu-bookworm-torch2130-py311-stable", "cuda128-sm90-torch280-py312-stable", "cuda128-sm90-torch280-py312-enhanced", "dtk2404-torch210-py310-stable", "dtk2604-bw-torch2100-py310-stable", "dtk2604-bw-torch2100-py310-enhanced", "dtk2604-k100-torch290-py310-stable", "dtk2604-k100-torch290-py310-enhanced", "rocm64-gfx942-torch280-py312-stable"]
}

target "cpu-bookworm-torch2130-py311-stable" {
  context    = "build/context/cpu-bookworm-torch2130-py311-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/cpu-bookworm-torch2130-py311:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1735689600"
  }
  labels = {
    "io.stackpin.cell"    = "cpu-bookworm-torch2130-py311"
    "io.stackpin.variant" = "stable"
  }
}

target "cuda128-sm90-torch280-py312-stable" {
  context    = "build/context/cuda128-sm90-torch280-py312-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/cuda128-sm90-torch280-py312:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "cuda128-sm90-torch280-py312"
    "io.stackpin.variant" = "stable"
  }
}

target "cuda128-sm90-torch280-py312-enhanced" {
  context    = "build/context/cuda128-sm90-torch280-py312-enhanced"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/cuda128-sm90-torch280-py312:enhanced"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "cuda128-sm90-torch280-py312"
    "io.stackpin.variant" = "enhanced"
  }
}

target "dtk2404-torch210-py310-stable" {
  context    = "build/context/dtk2404-torch210-py310-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/dtk2404-torch210-py310:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1704067200"
  }
  labels = {
    "io.stackpin.cell"    = "dtk2404-torch210-py310"
    "io.stackpin.variant" = "stable"
  }
}

target "dtk2604-bw-torch2100-py310-stable" {
  context    = "build/context/dtk2604-bw-torch2100-py310-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/dtk2604-bw-torch2100-py310:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "dtk2604-bw-torch2100-py310"
    "io.stackpin.variant" = "stable"
  }
}

target "dtk2604-bw-torch2100-py310-enhanced" {
  context    = "build/context/dtk2604-bw-torch2100-py310-enhanced"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/dtk2604-bw-torch2100-py310:enhanced"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "dtk2604-bw-torch2100-py310"
    "io.stackpin.variant" = "enhanced"
  }
}

target "dtk2604-k100-torch290-py310-stable" {
  context    = "build/context/dtk2604-k100-torch290-py310-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/dtk2604-k100-torch290-py310:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "dtk2604-k100-torch290-py310"
    "io.stackpin.variant" = "stable"
  }
}

target "dtk2604-k100-torch290-py310-enhanced" {
  context    = "build/context/dtk2604-k100-torch290-py310-enhanced"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/dtk2604-k100-torch290-py310:enhanced"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "dtk2604-k100-torch290-py310"
    "io.stackpin.variant" = "enhanced"
  }
}

target "rocm64-gfx942-torch280-py312-stable" {
  context    = "build/context/rocm64-gfx942-torch280-py312-stable"
  dockerfile = "Dockerfile"
  tags       = ["stackpin/rocm64-gfx942-torch280-py312:stable"]
  platforms  = ["linux/amd64"]
  network    = "none"
  args = {
    "SOURCE_DATE_EPOCH" = "1767225600"
  }
  labels = {
    "io.stackpin.cell"    = "rocm64-gfx942-torch280-py312"
    "io.stackpin.variant" = "stable"
  }
}
