//! What the integration tests share: a kube-rs client for a simulated
//! apiserver, made from the kubeconfig the kit writes.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tether_testkit::ApiServer;

/// The kube `Config` of `server`'s kubeconfig.
pub(crate) async fn config_for(server: &ApiServer) -> kube::Config {
    let kubeconfig =
        Kubeconfig::from_yaml(&server.kubeconfig().to_yaml()).expect("valid kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig resolves")
}

/// A client with kube's defaults for `server`.
pub(crate) async fn client_for(server: &ApiServer) -> Client {
    Client::try_from(config_for(server).await).expect("client builds")
}
