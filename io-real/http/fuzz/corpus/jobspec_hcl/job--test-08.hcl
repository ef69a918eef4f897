job "web" {
  colour = "blue"
  group "g" {
    count = "two"
    task "t" {
      driver       = "exec"
      kill_timeout = "soon"
      resources { disk = 10 }
    }
  }
}
