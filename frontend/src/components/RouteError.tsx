import { isRouteErrorResponse, Link, useRouteError } from 'react-router'

/** Shown when a page throws while rendering or loading, instead of a blank screen. */
export function RouteError() {
  const error = useRouteError()
  let message: string
  if (isRouteErrorResponse(error)) message = `${error.status} ${error.statusText}`
  else if (error instanceof Error) message = error.message
  else message = String(error)

  return (
    <main id="main" className="content content--narrow">
      <h1>Something went wrong</h1>
      <p className="error-text">{message}</p>
      <p>
        <Link to="/">Back to the queue</Link>
      </p>
    </main>
  )
}
