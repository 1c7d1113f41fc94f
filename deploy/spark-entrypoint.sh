#!/usr/bin/env bash
# The pipeline image's entry point.
#
#   executor     what Spark on Kubernetes runs in each executor pod: it starts
#                Spark's Kubernetes executor backend from the environment
#                Spark sets on the pod (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...)
#   driver ARGS  spark-submit in client mode (Spark's cluster mode starts the
#                driver pod with this)
#   anything else is run as given (tablecast run ..., spark-submit ..., bash)
set -euo pipefail

case "${1:-}" in
  executor)
    shift
    java_opts=()
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in order
    while IFS= read -r name; do
      java_opts+=("${!name}")
    done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)
    exec java "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_HOME}/jars/*:${SPARK_CLASSPATH:-}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-$(hostname)}"
    ;;
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" --deploy-mode client \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
