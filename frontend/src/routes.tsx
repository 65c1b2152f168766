import type { RouteObject } from 'react-router'
import { BareLayout, Layout } from './components/Layout'
import { Root } from './components/Root'
import { RouteError } from './components/RouteError'
import { ArtifactsPage } from './pages/ArtifactsPage'
import { ComparePage } from './pages/ComparePage'
import { DatasetsPage } from './pages/DatasetsPage'
import { JobPage } from './pages/JobPage'
import { ModelsPage } from './pages/ModelsPage'
import { NewJobPage } from './pages/NewJobPage'
import { NotFoundPage } from './pages/NotFoundPage'
import { NotificationsPage } from './pages/NotificationsPage'
import { PlaygroundPage } from './pages/PlaygroundPage'
import { QueuePage } from './pages/QueuePage'
import { SetupPage } from './pages/SetupPage'
import { SignInPage } from './pages/SignInPage'
import { SweepPage } from './pages/SweepPage'
import { TokensPage } from './pages/TokensPage'

/**
 * The whole route tree, shared by the browser router (main.tsx) and the memory router in tests.
 * Browser-history URLs: the backend must answer unknown non-API paths with index.html.
 */
export const routes: RouteObject[] = [
  {
    element: <Root />,
    errorElement: <RouteError />,
    children: [
      {
        element: <BareLayout />,
        children: [
          { path: 'setup', element: <SetupPage /> },
          { path: 'signin', element: <SignInPage /> },
        ],
      },
      {
        element: <Layout />,
        children: [
          { index: true, element: <QueuePage /> },
          { path: 'jobs/new', element: <NewJobPage /> },
          { path: 'jobs/:id', element: <JobPage /> },
          { path: 'sweeps/:id', element: <SweepPage /> },
          { path: 'datasets', element: <DatasetsPage /> },
          { path: 'models', element: <ModelsPage /> },
          { path: 'artifacts', element: <ArtifactsPage /> },
          { path: 'compare', element: <ComparePage /> },
          { path: 'playground', element: <PlaygroundPage /> },
          { path: 'account/tokens', element: <TokensPage /> },
          { path: 'account/notifications', element: <NotificationsPage /> },
          { path: '*', element: <NotFoundPage /> },
        ],
      },
    ],
  },
]
